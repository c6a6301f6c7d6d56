package broker

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestMessageDownconversionEnable: Kafka 3.x's message.downconversion.enable
// (deprecated, boolean, default true) is accepted on create and alter and
// described with its source and type; a non-boolean is INVALID_CONFIG.
func TestMessageDownconversionEnable(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := ctxT(t)
	_, adm := client(t, ts.addr)
	const name = "message.downconversion.enable"
	describe := func(topic string) kadm.Config {
		t.Helper()
		rc, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil || rc[0].Err != nil {
			t.Fatal(err, rc)
		}
		for _, c := range rc[0].Configs {
			if c.Key == name {
				return c
			}
		}
		t.Fatalf("%s not described for %s", name, topic)
		return kadm.Config{}
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "dc-default"); err != nil {
		t.Fatal(err)
	}
	if c := describe("dc-default"); c.MaybeValue() != "true" || c.Source != kmsg.ConfigSourceDefaultConfig {
		t.Fatalf("default: %+v", c)
	}
	if r, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{name: kmsg.StringPtr("false")}, "dc"); err != nil || r.Err != nil {
		t.Fatalf("create with %s=false: %v %v", name, err, r.Err)
	}
	if c := describe("dc"); c.MaybeValue() != "false" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("set on create: %+v", c)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: kmsg.StringPtr("true")}}, "dc"); err != nil {
		t.Fatal(err)
	}
	if c := describe("dc"); c.MaybeValue() != "true" || c.Source != kmsg.ConfigSourceDynamicTopicConfig {
		t.Fatalf("altered: %+v", c)
	}
	r, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{name: kmsg.StringPtr("maybe")}, "dc-bad")
	if err == nil {
		err = r.Err
	}
	if !errors.Is(err, kerr.InvalidConfig) {
		t.Fatalf("%s=maybe: %v, want INVALID_CONFIG", name, err)
	}
}
