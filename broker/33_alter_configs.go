package broker

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// AlterConfigs: v0-2 and IncrementalAlterConfigs: v0-1
//
// Behavior:
//   - Topics only. AlterConfigs replaces the topic's whole set of configs
//     (those not named return to defaults), as Kafka does;
//     IncrementalAlterConfigs applies SET / DELETE per key, and APPEND /
//     SUBTRACT on list configs (cleanup.policy); on others INVALID_CONFIG.
//   - Every name and value is validated before anything changes
//     (INVALID_CONFIG); ValidateOnly stops there. Changes apply to the
//     partitions at once (segment size, retention, max.message.bytes, ...).
//   - Broker resources: INVALID_REQUEST (broker settings are flags).
func (s *Server) handleAlterConfigs(c *conn, req *kmsg.AlterConfigsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.AlterConfigsResponse)
	for _, rr := range req.Resources {
		sr := kmsg.NewAlterConfigsResponseResource()
		sr.ResourceType, sr.ResourceName = rr.ResourceType, rr.ResourceName
		if code := c.configsDenied(rr.ResourceType, rr.ResourceName, opAlterConfigs); code != 0 {
			sr.ErrorCode = code
			resp.Resources = append(resp.Resources, sr)
			continue
		}
		configs := map[string]string{}
		for _, c := range rr.Configs {
			if c.Value != nil {
				configs[c.Name] = *c.Value
			}
		}
		sr.ErrorCode, sr.ErrorMessage = s.applyConfigs(rr.ResourceType, rr.ResourceName, func(map[string]string) (map[string]string, error) {
			return configs, nil
		}, req.ValidateOnly)
		resp.Resources = append(resp.Resources, sr)
	}
	return resp, nil
}

func (s *Server) handleIncrementalAlterConfigs(c *conn, req *kmsg.IncrementalAlterConfigsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
	for _, rr := range req.Resources {
		sr := kmsg.NewIncrementalAlterConfigsResponseResource()
		sr.ResourceType, sr.ResourceName = rr.ResourceType, rr.ResourceName
		if code := c.configsDenied(rr.ResourceType, rr.ResourceName, opAlterConfigs); code != 0 {
			sr.ErrorCode = code
			resp.Resources = append(resp.Resources, sr)
			continue
		}
		sr.ErrorCode, sr.ErrorMessage = s.applyConfigs(rr.ResourceType, rr.ResourceName, func(cur map[string]string) (map[string]string, error) {
			for _, c := range rr.Configs {
				switch c.Op {
				case kmsg.IncrementalAlterConfigOpSet:
					if c.Value == nil {
						return nil, errConfigf("no value to set for %s", c.Name)
					}
					cur[c.Name] = *c.Value
				case kmsg.IncrementalAlterConfigOpDelete:
					delete(cur, c.Name)
				case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
					d := configByName[c.Name]
					if d == nil || d.typ != cfgList {
						return nil, errConfigf("%s is not a list config: APPEND and SUBTRACT do not apply", c.Name)
					}
					if c.Value == nil {
						return nil, errConfigf("no value to append or subtract for %s", c.Name)
					}
					v, _ := configValue(cur, c.Name)
					items := splitList(v)
					for _, it := range splitList(*c.Value) {
						has := slices.Contains(items, it)
						switch {
						case c.Op == kmsg.IncrementalAlterConfigOpAppend && !has:
							items = append(items, it)
						case c.Op == kmsg.IncrementalAlterConfigOpSubtract && has:
							items = slices.DeleteFunc(items, func(x string) bool { return x == it })
						}
					}
					cur[c.Name] = strings.Join(items, ",")
				default:
					return nil, errConfigf("operation %v is not supported for %s", c.Op, c.Name)
				}
			}
			return cur, nil
		}, req.ValidateOnly)
		resp.Resources = append(resp.Resources, sr)
	}
	return resp, nil
}

type configError string

func (e configError) Error() string { return string(e) }

func errConfigf(format string, args ...any) error {
	return configError(fmt.Sprintf(format, args...))
}

// applyConfigs computes a topic's new config set with change, validates and
// stores it.
func (s *Server) applyConfigs(rtype kmsg.ConfigResourceType, name string, change func(map[string]string) (map[string]string, error), validateOnly bool) (int16, *string) {
	if rtype != kmsg.ConfigResourceTypeTopic {
		return kerr.InvalidRequest.Code, kmsg.StringPtr("only topic configs can be altered; broker settings are flags")
	}
	t := s.reg.get(name)
	if t == nil {
		return kerr.UnknownTopicOrPartition.Code, kmsg.StringPtr("unknown topic " + name)
	}
	cur := s.reg.configsOf(t)
	next, err := change(maps.Clone(cur)) // change may edit the map it is given
	if err == nil {
		check := next
		if v, ok := next[remoteStorageEnable]; ok && cur[remoteStorageEnable] == v {
			// Stored before the broker checked it: not this request's doing.
			check = maps.Clone(next)
			delete(check, remoteStorageEnable)
		}
		err = validateConfigs(check, s.cfg.Tier != nil)
	}
	if err != nil {
		return kerr.InvalidConfig.Code, kmsg.StringPtr(err.Error())
	}
	if validateOnly {
		return 0, nil
	}
	if err := s.setTopicConfigs(t, next); err != nil {
		return s.errorCode(err), kmsg.StringPtr(err.Error())
	}
	return 0, nil
}
