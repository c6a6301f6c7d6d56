package broker

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/synapsebroker/synapse/log"
)

// Config types as DescribeConfigs v3+ reports them.
const (
	cfgBoolean = 1
	cfgString  = 2
	cfgInt     = 3
	cfgLong    = 5
	cfgDouble  = 6
	cfgList    = 7
)

// configDef is one topic config under its Kafka name.
type configDef struct {
	name  string
	def   string
	typ   int8
	check func(string) error
	doc   string
}

func longAtLeast(min int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("not a long: %q", v)
		}
		if n < min {
			return fmt.Errorf("%d is below the minimum %d", n, min)
		}
		return nil
	}
}

func intRange(min, max int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return fmt.Errorf("not an int: %q", v)
		}
		if n < min || n > max {
			return fmt.Errorf("%d is outside [%d, %d]", n, min, max)
		}
		return nil
	}
}

func oneOf(vals ...string) func(string) error {
	return func(v string) error {
		for _, ok := range vals {
			if v == ok {
				return nil
			}
		}
		return fmt.Errorf("%q is not one of %v", v, vals)
	}
}

// listOf accepts a comma-separated list (spaces around items allowed, as
// Kafka's) of some of vals, each at most once.
func listOf(vals ...string) func(string) error {
	return func(v string) error {
		items := splitList(v)
		if len(items) == 0 {
			return fmt.Errorf("empty list: want some of %v", vals)
		}
		for i, it := range items {
			if !slices.Contains(vals, it) {
				return fmt.Errorf("%q is not one of %v", it, vals)
			}
			if slices.Contains(items[:i], it) {
				return fmt.Errorf("%q is listed twice", it)
			}
		}
		return nil
	}
}

// splitList splits a list config's value into its trimmed, non-empty items.
func splitList(v string) []string {
	var items []string
	for _, it := range strings.Split(v, ",") {
		if it = strings.TrimSpace(it); it != "" {
			items = append(items, it)
		}
	}
	return items
}

func isBool(v string) error {
	if v != "true" && v != "false" {
		return fmt.Errorf("not a boolean: %q", v)
	}
	return nil
}

// formatVersion is what Kafka 3.x accepts for message.format.version: a
// release ("0.10.2", "2.8") with an optional inter-broker version ("-IV1").
var formatVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?(-IV[0-9]+)?$`)

func isFormatVersion(v string) error {
	if !formatVersion.MatchString(v) {
		return fmt.Errorf("not a message format version: %q", v)
	}
	return nil
}

// isReplicaList is the throttled-replicas syntax: "", "*", or
// "partition:broker" pairs, comma separated.
func isReplicaList(v string) error {
	if v == "" || v == "*" {
		return nil
	}
	for _, it := range strings.Split(v, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(it), ":")
		if _, err := strconv.Atoi(a); !ok || err != nil {
			return fmt.Errorf("not partition:broker: %q", it)
		}
		if _, err := strconv.Atoi(b); err != nil {
			return fmt.Errorf("not partition:broker: %q", it)
		}
	}
	return nil
}

func isDouble(v string) error {
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return fmt.Errorf("not a double: %q", v)
	}
	return nil
}

// topicConfigs are the topic configs Synapse knows, with Kafka's names and
// (where Synapse differs on purpose, noted) defaults. Those marked "stored"
// are accepted and reported for compatibility but do not change behaviour.
var topicConfigs = []configDef{
	{"cleanup.policy", "delete", cfgList, listOf("delete", "compact"), "delete: retention.* applies; compact: the latest record per key is kept (the log cleaner); records without a key are refused"},
	{"compression.gzip.level", "-1", cfgInt, intRange(-1, 9), "stored: batches are never recompressed"},
	{"compression.lz4.level", "9", cfgInt, intRange(1, 17), "stored: batches are never recompressed"},
	{"compression.zstd.level", "3", cfgInt, intRange(-131072, 22), "stored: batches are never recompressed"},
	{"compression.type", "producer", cfgString, oneOf("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), "stored: batches are kept as the producer compressed them"},
	{"delete.retention.ms", "86400000", cfgLong, longAtLeast(0), "compacted topics: how long a tombstone stays after the clean that first saw it"},
	{"file.delete.delay.ms", "60000", cfgLong, longAtLeast(0), "stored"},
	{"flush.messages", "9223372036854775807", cfgLong, longAtLeast(1), "stored: durability is the broker's fsync policy"},
	{"flush.ms", "9223372036854775807", cfgLong, longAtLeast(0), "stored: durability is the broker's fsync policy"},
	{"follower.replication.throttled.replicas", "", cfgList, isReplicaList, "stored: one replica, nothing to throttle"},
	{"index.interval.bytes", "4096", cfgInt, intRange(0, 1<<31-1), "bytes between sparse offset-index entries"},
	{"local.retention.bytes", "-2", cfgLong, longAtLeast(-2), "with tiering: bytes of the newest data kept on local disk once uploaded (-2: as retention.bytes)"},
	{"local.retention.ms", "-2", cfgLong, longAtLeast(-2), "with tiering: age up to which uploaded data stays on local disk too (-2: as retention.ms)"},
	{"leader.replication.throttled.replicas", "", cfgList, isReplicaList, "stored: one replica, nothing to throttle"},
	{"max.compaction.lag.ms", "9223372036854775807", cfgLong, longAtLeast(1), "compacted topics: a partition whose oldest dirty segment is older is cleaned whatever its dirty ratio"},
	{"max.message.bytes", "1048588", cfgInt, intRange(0, 1<<31-1), "largest record batch accepted"},
	{"message.downconversion.enable", "true", cfgBoolean, isBool, "stored: deprecated in Kafka 3.x (KIP-724); Fetch is served from v4, record batches v2, so nothing is ever down-converted"},
	{"message.format.version", "3.0-IV1", cfgString, isFormatVersion, "stored: deprecated in Kafka 3.x (batches are always v2)"},
	{"message.timestamp.after.max.ms", "9223372036854775807", cfgLong, longAtLeast(0), "CreateTime: how far after the broker's clock a batch's first and greatest timestamps may be (else INVALID_TIMESTAMP)"},
	{"message.timestamp.before.max.ms", "9223372036854775807", cfgLong, longAtLeast(0), "CreateTime: how far before the broker's clock a batch's first and greatest timestamps may be (else INVALID_TIMESTAMP)"},
	{"message.timestamp.difference.max.ms", "9223372036854775807", cfgLong, longAtLeast(0), "CreateTime: how far before or after the broker's clock a batch's first and greatest timestamps may be (else INVALID_TIMESTAMP)"},
	{"message.timestamp.type", "CreateTime", cfgString, oneOf("CreateTime", "LogAppendTime"), "LogAppendTime: the broker stamps batches on append"},
	{"min.cleanable.dirty.ratio", "0.5", cfgDouble, isDouble, "compacted topics: the share of uncleaned bytes that makes a partition due for cleaning"},
	{"min.compaction.lag.ms", "0", cfgLong, longAtLeast(0), "compacted topics: records younger than this are not cleaned"},
	{"min.insync.replicas", "1", cfgInt, intRange(1, 1), "one replica: always 1"},
	{"preallocate", "false", cfgBoolean, isBool, "stored"},
	{"remote.storage.enable", "false", cfgBoolean, isBool, "true on a broker with a tiered store (--tier): every topic is tiered there, none elsewhere; only that value is accepted"},
	{"retention.bytes", "-1", cfgLong, longAtLeast(-1), "whole-log size bound, oldest segments deleted first"},
	{"retention.ms", "604800000", cfgLong, longAtLeast(-1), "age bound by each segment's max timestamp; -1 keeps forever"},
	{"segment.bytes", strconv.Itoa(log.DefaultSegmentBytes), cfgInt, intRange(14, 1<<30), "segment size (Synapse default 128 MiB; Kafka's is 1 GiB)"},
	{"segment.index.bytes", "10485760", cfgInt, intRange(4, 1<<31-1), "stored: indexes are sized by the data"},
	{"segment.jitter.ms", "0", cfgLong, longAtLeast(0), "stored"},
	{"segment.ms", strconv.FormatInt(log.DefaultSegmentMs, 10), cfgLong, longAtLeast(1), "segment age before it rolls (Synapse default 1 h so idle partitions seal; Kafka's is 7 days)"},
	{"unclean.leader.election.enable", "false", cfgBoolean, isBool, "stored"},
}

var configByName = func() map[string]*configDef {
	m := make(map[string]*configDef, len(topicConfigs))
	for i := range topicConfigs {
		m[topicConfigs[i].name] = &topicConfigs[i]
	}
	return m
}()

// validateConfigs checks names and values for a broker with (tiered) or
// without a tiered store; the error names the culprit.
func validateConfigs(cfg map[string]string, tiered bool) error {
	for k, v := range cfg {
		d, ok := configByName[k]
		if !ok {
			return fmt.Errorf("unknown topic config %q", k)
		}
		if err := d.check(v); err != nil {
			return fmt.Errorf("invalid value for %s: %v", k, err)
		}
	}
	if v, ok := cfg[remoteStorageEnable]; ok && v != strconv.FormatBool(tiered) {
		if tiered {
			return fmt.Errorf("invalid value for %s: every topic is tiered on this broker (--tier); it cannot be turned off per topic", remoteStorageEnable)
		}
		return fmt.Errorf("invalid value for %s: this broker has no tiered store (--tier none)", remoteStorageEnable)
	}
	return nil
}

// remoteStorageEnable is the one topic config whose value follows the
// broker: true exactly when it has a tiered store.
const remoteStorageEnable = "remote.storage.enable"

// configValue returns the effective value and whether it was set on the topic.
func configValue(set map[string]string, name string) (string, bool) {
	if v, ok := set[name]; ok {
		return v, true
	}
	return configByName[name].def, false
}

// topicConfig is a topic's effective value of config name on this broker
// and where it comes from: the topic (DYNAMIC_TOPIC_CONFIG), a broker flag
// (STATIC_BROKER_CONFIG: local.retention.*) or the default.
// remote.storage.enable follows the broker (a tiered store or not).
func (s *Server) topicConfig(set map[string]string, name string) (string, kmsg.ConfigSource) {
	v, ok := set[name]
	if name == remoteStorageEnable {
		if truth := strconv.FormatBool(s.cfg.Tier != nil); v != truth {
			return truth, kmsg.ConfigSourceDefaultConfig // a stored value saying otherwise predates the check
		}
	}
	if ok {
		return v, kmsg.ConfigSourceDynamicTopicConfig
	}
	switch name {
	case "local.retention.bytes", "local.retention.ms":
		n := s.cfg.LocalRetention.Bytes
		if name == "local.retention.ms" {
			n = s.cfg.LocalRetention.Ms
		}
		if v := strconv.FormatInt(n, 10); v != configByName[name].def {
			return v, kmsg.ConfigSourceStaticBrokerConfig
		}
	}
	return configByName[name].def, kmsg.ConfigSourceDefaultConfig
}

// topicConfigInt is topicConfig as a number.
func (s *Server) topicConfigInt(set map[string]string, name string) int64 {
	v, _ := s.topicConfig(set, name)
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

func configInt(set map[string]string, name string) int64 {
	v, _ := configValue(set, name)
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// logConfig maps a topic's configs onto the log engine's.
func logConfig(set map[string]string) log.Config {
	rb, rm := retention(set)
	return log.Config{
		SegmentBytes:       configInt(set, "segment.bytes"),
		SegmentMs:          configInt(set, "segment.ms"),
		IndexIntervalBytes: max(configInt(set, "index.interval.bytes"), 1),
		MaxMessageBytes:    int(max(configInt(set, "max.message.bytes"), 1)),
		RetentionBytes:     rb,
		RetentionMs:        rm,
		ExactRetention:     true, // 0 is a bound, as in Kafka
	}
}

// retention is the whole-log retention of a topic (retention.bytes,
// retention.ms): none unless cleanup.policy includes delete. A compact-only
// topic is never cut by age or size: the log cleaner (cleaner.go) removes
// what a newer record of the same key replaced.
func retention(set map[string]string) (bytes, ms int64) {
	policy, _ := configValue(set, "cleanup.policy")
	if !slices.Contains(splitList(policy), "delete") {
		return -1, -1
	}
	return configInt(set, "retention.bytes"), configInt(set, "retention.ms")
}

// compacted reports whether a topic's cleanup.policy includes compact (its
// records need keys; the cleaner compacts it).
func compacted(set map[string]string) bool {
	policy, _ := configValue(set, "cleanup.policy")
	return slices.Contains(splitList(policy), "compact")
}

func sortedConfigNames() []string {
	names := make([]string, 0, len(topicConfigs))
	for _, d := range topicConfigs {
		names = append(names, d.name)
	}
	sort.Strings(names)
	return names
}
