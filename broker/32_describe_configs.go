package broker

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeConfigs: v0-4
//
// Behavior:
//   - Topics: every config Synapse knows with its effective value, its source
//     (DYNAMIC_TOPIC_CONFIG when set on the topic, STATIC_BROKER_CONFIG for
//     local.retention.* set by --local-retention-*, DEFAULT_CONFIG
//     otherwise), read-only false, and (v1+ when asked) synonyms; v3+ types
//     and docs. remote.storage.enable is the broker's: true with a tiered
//     store.
//     Requested names Synapse does not know are left out, as Kafka does.
//   - Brokers (this node id, or the empty name): the broker settings that
//     matter to clients, read-only.
//   - Unknown topics: UNKNOWN_TOPIC_OR_PARTITION; other broker ids:
//     INVALID_REQUEST.
func (s *Server) handleDescribeConfigs(c *conn, req *kmsg.DescribeConfigsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
	for _, rr := range req.Resources {
		sr := kmsg.NewDescribeConfigsResponseResource()
		sr.ResourceType, sr.ResourceName = rr.ResourceType, rr.ResourceName
		want := map[string]bool{}
		for _, n := range rr.ConfigNames {
			want[n] = true
		}
		if code := c.configsDenied(rr.ResourceType, rr.ResourceName, opDescribeConfigs); code != 0 {
			sr.ErrorCode = code
			resp.Resources = append(resp.Resources, sr)
			continue
		}
		switch rr.ResourceType {
		case kmsg.ConfigResourceTypeTopic:
			t := s.reg.get(rr.ResourceName)
			if t == nil {
				sr.ErrorCode = kerr.UnknownTopicOrPartition.Code
				sr.ErrorMessage = kmsg.StringPtr("unknown topic " + rr.ResourceName)
				break
			}
			set := s.reg.configsOf(t)
			for _, d := range topicConfigs {
				if len(rr.ConfigNames) > 0 && !want[d.name] {
					continue
				}
				v, src := s.topicConfig(set, d.name)
				def, defSrc := s.topicConfig(nil, d.name) // what the topic gets unless it sets one
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Value = d.name, kmsg.StringPtr(v)
				c.Source = src
				c.IsDefault = src == kmsg.ConfigSourceDefaultConfig
				c.ConfigType = kmsg.ConfigType(d.typ)
				if req.IncludeDocumentation {
					c.Documentation = kmsg.StringPtr(d.doc)
				}
				if req.IncludeSynonyms {
					if src == kmsg.ConfigSourceDynamicTopicConfig {
						syn := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
						syn.Name, syn.Value, syn.Source = d.name, kmsg.StringPtr(v), kmsg.ConfigSourceDynamicTopicConfig
						c.ConfigSynonyms = append(c.ConfigSynonyms, syn)
					}
					if defSrc == kmsg.ConfigSourceStaticBrokerConfig {
						syn := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
						syn.Name, syn.Value, syn.Source = "log."+d.name, kmsg.StringPtr(def), kmsg.ConfigSourceStaticBrokerConfig
						c.ConfigSynonyms = append(c.ConfigSynonyms, syn)
						def = d.def
					}
					syn := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
					syn.Name, syn.Value, syn.Source = d.name, kmsg.StringPtr(def), kmsg.ConfigSourceDefaultConfig
					c.ConfigSynonyms = append(c.ConfigSynonyms, syn)
				}
				sr.Configs = append(sr.Configs, c)
			}
		case kmsg.ConfigResourceTypeBroker:
			if rr.ResourceName != "" && rr.ResourceName != strconv.Itoa(int(s.meta.m.NodeID)) {
				sr.ErrorCode = kerr.InvalidRequest.Code
				sr.ErrorMessage = kmsg.StringPtr("unknown broker " + rr.ResourceName)
				break
			}
			for _, kv := range s.brokerConfigs() {
				if len(rr.ConfigNames) > 0 && !want[kv[0]] {
					continue
				}
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Value, c.ReadOnly = kv[0], kmsg.StringPtr(kv[1]), true
				c.Source = kmsg.ConfigSourceStaticBrokerConfig
				c.ConfigType = kmsg.ConfigType(cfgString)
				sr.Configs = append(sr.Configs, c)
			}
		default:
			sr.ErrorCode = kerr.InvalidRequest.Code
			sr.ErrorMessage = kmsg.StringPtr("unsupported resource type")
		}
		resp.Resources = append(resp.Resources, sr)
	}
	return resp, nil
}

func (s *Server) brokerConfigs() [][2]string {
	return [][2]string{
		{"auto.create.topics.enable", strconv.FormatBool(s.cfg.AutoCreateTopics)},
		{"broker.id", strconv.Itoa(int(s.meta.m.NodeID))},
		{"num.partitions", strconv.Itoa(int(s.cfg.DefaultPartitions))},
		{"socket.request.max.bytes", strconv.Itoa(s.cfg.MaxFrameSize)},
		{"connections.max.idle.ms", strconv.FormatInt(s.cfg.IdleTimeout.Milliseconds(), 10)},
		{"default.replication.factor", "1"},
		{"min.insync.replicas", "1"},
		{"remote.log.storage.system.enable", strconv.FormatBool(s.cfg.Tier != nil)},
		{"log.local.retention.bytes", strconv.FormatInt(s.cfg.LocalRetention.Bytes, 10)},
		{"log.local.retention.ms", strconv.FormatInt(s.cfg.LocalRetention.Ms, 10)},
	}
}
