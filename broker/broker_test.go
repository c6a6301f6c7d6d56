package broker

import (
	"slices"
	"testing"

	"github.com/synapsebroker/synapse/protocol"
)

// TestEveryAdvertisedKeyHasAHandler keeps ApiVersions honest.
func TestEveryAdvertisedKeyHasAHandler(t *testing.T) {
	for _, v := range protocol.Versions() {
		if !slices.Contains(handled, v.Key) {
			t.Errorf("key %d is advertised but has no handler", v.Key)
		}
	}
	for _, k := range handled {
		if !protocol.Implemented(k) {
			t.Errorf("key %d has a handler but is not advertised", k)
		}
	}
}

func TestValidTopicName(t *testing.T) {
	for name, ok := range map[string]bool{
		"orders": true, "a.b_c-d": true, "": false, ".": false, "..": false,
		"has space": false, "slash/": false, string(make([]byte, 250)): false,
	} {
		if err := validTopicName(name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
	}
}
