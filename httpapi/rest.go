package httpapi

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// The Confluent REST Proxy v2 subset (as Redpanda's HTTP Proxy serves it):
// topics, produce with the binary and JSON embedded formats, consumers
// (consumers.go).

const (
	mediaV2     = "application/vnd.kafka.v2+json"
	mediaBinary = "application/vnd.kafka.binary.v2+json"
	mediaJSONV2 = "application/vnd.kafka.json.v2+json"
)

// metadata asks the broker for topics (nil: all), never auto-creating
// them: the HTTP API creates no topic.
func (a *API) metadata(q *request, sc *sharedClient, topics []string) (*kmsg.MetadataResponse, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	if topics != nil {
		req.Topics = []kmsg.MetadataRequestTopic{}
		for _, t := range topics {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
	}
	resp, err := req.RequestWith(q.ctx, sc.cl)
	if err != nil {
		return nil, clientErr(err, "", -1)
	}
	return resp, nil
}

// topicMeta is the metadata of one topic, or its error.
func (a *API) topicMeta(q *request, sc *sharedClient, topic string) (*kmsg.MetadataResponseTopic, error) {
	md, err := a.metadata(q, sc, []string{topic})
	if err != nil {
		return nil, err
	}
	for i := range md.Topics {
		t := &md.Topics[i]
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, kafkaErr(t.ErrorCode, topic, -1)
		}
		slices.SortFunc(t.Partitions, func(a, b kmsg.MetadataResponseTopicPartition) int { return int(a.Partition - b.Partition) })
		return t, nil
	}
	return nil, errTopicNotFound(topic)
}

type replicaJSON struct {
	Broker int32 `json:"broker"`
	Leader bool  `json:"leader"`
	InSync bool  `json:"in_sync"`
}

type partitionJSON struct {
	Partition int32         `json:"partition"`
	Leader    int32         `json:"leader"`
	Replicas  []replicaJSON `json:"replicas"`
}

func partitionOf(p kmsg.MetadataResponseTopicPartition) partitionJSON {
	out := partitionJSON{Partition: p.Partition, Leader: p.Leader, Replicas: []replicaJSON{}}
	for _, r := range p.Replicas {
		out.Replicas = append(out.Replicas, replicaJSON{Broker: r, Leader: r == p.Leader, InSync: slices.Contains(p.ISR, r)})
	}
	return out
}

// withClient runs fn with the caller's shared client.
func (a *API) withClient(q *request, fn func(sc *sharedClient) error) {
	sc, err := a.client(q)
	if err != nil {
		q.fail(err)
		return
	}
	defer a.clients.release(sc)
	if err := fn(sc); err != nil {
		q.fail(err)
	}
}

// GET /topics: the names of the topics the caller may describe.
func (a *API) listTopics(q *request) {
	a.withClient(q, func(sc *sharedClient) error {
		md, err := a.metadata(q, sc, nil)
		if err != nil {
			return err
		}
		names := []string{}
		for _, t := range md.Topics {
			if t.ErrorCode == 0 && t.Topic != nil {
				names = append(names, *t.Topic)
			}
		}
		slices.Sort(names)
		q.reply(http.StatusOK, mediaV2, names)
		return nil
	})
}

// GET /topics/{topic}: name, configs, partitions.
func (a *API) getTopic(q *request) {
	topic := q.r.PathValue("topic")
	a.withClient(q, func(sc *sharedClient) error {
		t, err := a.topicMeta(q, sc, topic)
		if err != nil {
			return err
		}
		configs := map[string]string{}
		req := kmsg.NewPtrDescribeConfigsRequest()
		rr := kmsg.NewDescribeConfigsRequestResource()
		rr.ResourceType = kmsg.ConfigResourceTypeTopic
		rr.ResourceName = topic
		req.Resources = append(req.Resources, rr)
		// Configs are shown where the caller may describe them (an ACL of
		// its own); the rest of the answer does not depend on it.
		if resp, err := req.RequestWith(q.ctx, sc.cl); err == nil {
			for _, r := range resp.Resources {
				if r.ErrorCode != 0 {
					continue
				}
				for _, c := range r.Configs {
					if c.Value != nil && !c.IsSensitive {
						configs[c.Name] = *c.Value
					}
				}
			}
		}
		parts := []partitionJSON{}
		for _, p := range t.Partitions {
			parts = append(parts, partitionOf(p))
		}
		q.reply(http.StatusOK, mediaV2, map[string]any{"name": topic, "configs": configs, "partitions": parts})
		return nil
	})
}

// GET /topics/{topic}/partitions
func (a *API) listPartitions(q *request) {
	topic := q.r.PathValue("topic")
	a.withClient(q, func(sc *sharedClient) error {
		t, err := a.topicMeta(q, sc, topic)
		if err != nil {
			return err
		}
		parts := []partitionJSON{}
		for _, p := range t.Partitions {
			parts = append(parts, partitionOf(p))
		}
		q.reply(http.StatusOK, mediaV2, parts)
		return nil
	})
}

// pathPartition is the {partition} of the path.
func pathPartition(q *request) (int32, error) {
	s := q.r.PathValue("partition")
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, errBadRequest("partition %q is not a number", s)
	}
	if v < 0 {
		return 0, errInvalid("partition %d must not be negative", v)
	}
	return int32(v), nil
}

// GET /topics/{topic}/partitions/{partition}
func (a *API) getPartition(q *request) {
	topic := q.r.PathValue("topic")
	p, err := pathPartition(q)
	if err != nil {
		q.fail(err)
		return
	}
	a.withClient(q, func(sc *sharedClient) error {
		t, err := a.topicMeta(q, sc, topic)
		if err != nil {
			return err
		}
		for _, mp := range t.Partitions {
			if mp.Partition == p {
				q.reply(http.StatusOK, mediaV2, partitionOf(mp))
				return nil
			}
		}
		return errPartitionNotFound(topic, p)
	})
}

// GET /topics/{topic}/partitions/{partition}/offsets: beginning and end.
func (a *API) partitionOffsets(q *request) {
	topic := q.r.PathValue("topic")
	p, err := pathPartition(q)
	if err != nil {
		q.fail(err)
		return
	}
	a.withClient(q, func(sc *sharedClient) error {
		begin, err := a.listOffset(q, sc, topic, p, -2)
		if err != nil {
			return err
		}
		end, err := a.listOffset(q, sc, topic, p, -1)
		if err != nil {
			return err
		}
		q.reply(http.StatusOK, mediaV2, map[string]int64{"beginning_offset": begin, "end_offset": end})
		return nil
	})
}

// listOffset is ListOffsets of one partition at ts (-2 earliest, -1
// latest).
func (a *API) listOffset(q *request, sc *sharedClient, topic string, p int32, ts int64) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = p
	rp.Timestamp = ts
	rp.CurrentLeaderEpoch = -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(q.ctx, sc.cl)
	if err != nil {
		return 0, clientErr(err, topic, p)
	}
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			if rp.Partition != p {
				continue
			}
			if rp.ErrorCode != 0 {
				e := kafkaErr(rp.ErrorCode, topic, p)
				if e.code == 40402 && !a.topicExists(q, sc, topic) {
					e = errTopicNotFound(topic)
				}
				return 0, e
			}
			return rp.Offset, nil
		}
	}
	return 0, errPartitionNotFound(topic, p)
}

// restRecords is the body of the REST produce: keys and values base64
// (binary) or any JSON (json), partition optional.
type restRecords struct {
	Records []struct {
		Key       json.RawMessage `json:"key"`
		Value     json.RawMessage `json:"value"`
		Partition *int32          `json:"partition"`
	} `json:"records"`
}

// offsetJSON is one record's outcome: its offset, or (offset null) an
// error_code (1 not retriable, 2 retriable) and error.
type offsetJSON struct {
	Partition int32   `json:"partition"`
	Offset    *int64  `json:"offset"`
	ErrorCode *int    `json:"error_code"`
	Error     *string `json:"error"`
}

// POST /topics/{topic} and /topics/{topic}/partitions/{partition} with
// application/vnd.kafka.binary.v2+json or .json.v2+json.
func (a *API) restProduce(q *request) {
	ct := mediaType(q.r)
	if ct != mediaBinary && ct != mediaJSONV2 {
		q.fail(errContentType(ct, mediaBinary, mediaJSONV2))
		return
	}
	topic := q.r.PathValue("topic")
	fixed := int32(-1)
	if q.r.PathValue("partition") != "" {
		p, err := pathPartition(q)
		if err != nil {
			q.fail(err)
			return
		}
		fixed = p
	}
	var body restRecords
	if err := decodeJSON(q.r.Body, &body); err != nil {
		q.fail(err)
		return
	}
	if len(body.Records) == 0 {
		q.fail(errInvalid("no records: want {\"records\":[{\"value\":...}]}"))
		return
	}
	if len(body.Records) > a.cfg.MaxRecords {
		q.fail(a.tooMany(len(body.Records)))
		return
	}
	decode := func(raw json.RawMessage, what string, i int) ([]byte, error) {
		if len(raw) == 0 || string(raw) == "null" {
			return nil, nil
		}
		if ct == mediaJSONV2 {
			return []byte(raw), nil
		}
		var b []byte
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, errInvalid("records[%d].%s: not a base64 string (the binary embedded format): %v", i, what, err)
		}
		return b, nil
	}
	recs := make([]record, len(body.Records))
	parts := make([]int32, len(body.Records))
	needMeta := false
	for i, r := range body.Records {
		var err error
		if recs[i].Key, err = decode(r.Key, "key", i); err != nil {
			q.fail(err)
			return
		}
		if recs[i].Value, err = decode(r.Value, "value", i); err != nil {
			q.fail(err)
			return
		}
		switch {
		case fixed >= 0:
			parts[i] = fixed
		case r.Partition != nil:
			if *r.Partition < 0 {
				q.fail(errInvalid("records[%d].partition %d must not be negative", i, *r.Partition))
				return
			}
			parts[i] = *r.Partition
		default:
			parts[i] = -1
			needMeta = true
		}
	}
	sc, err := a.client(q)
	if err != nil {
		q.fail(err)
		return
	}
	defer a.clients.release(sc)
	// The topic must exist (HTTP produce creates none), and so must every
	// partition named: checked before anything is written.
	explicit := map[int32][]record{}
	for _, p := range parts {
		if p >= 0 {
			explicit[p] = nil
		}
	}
	t, err := a.checkPartitions(q, sc, topic, explicit)
	if err != nil {
		q.fail(err)
		return
	}
	if needMeta {
		// Partitioned as Kafka's Java producer does: murmur2 of the key,
		// keyless records all to one partition (sticky, per request).
		n := int32(len(t.Partitions))
		if n == 0 {
			q.fail(newErr(http.StatusServiceUnavailable, 50301, "topic %s has no partitions yet", topic))
			return
		}
		sticky := rand.Int32N(n)
		for i := range parts {
			if parts[i] >= 0 {
				continue
			}
			if recs[i].Key == nil {
				parts[i] = sticky
			} else {
				parts[i] = int32(murmur2(recs[i].Key)&0x7fffffff) % n
			}
		}
	}
	byPart := map[int32][]record{}
	index := make([]int, len(recs)) // each record's place in its partition's batch
	for i, r := range recs {
		index[i] = len(byPart[parts[i]])
		byPart[parts[i]] = append(byPart[parts[i]], r)
	}
	out, err := a.produce(q, sc, topic, byPart)
	if err != nil {
		q.fail(err)
		return
	}
	// Every batch failed: nothing was written, one error says it. Some
	// failed: the others were written, so the answer is 200 with each
	// record's outcome, as the REST Proxy's (error_code 1: not retriable,
	// 2: retriable; offset null), and a client retries only those.
	written := false
	for _, o := range out {
		written = written || o.err == nil
	}
	if !written {
		q.fail(out[parts[0]].err)
		return
	}
	offsets := make([]offsetJSON, len(recs))
	for i := range recs {
		o := out[parts[i]]
		offsets[i] = offsetJSON{Partition: parts[i]}
		if o.err != nil {
			code, msg := 1, o.err.msg
			if o.err.status == http.StatusServiceUnavailable || o.err.status == http.StatusGatewayTimeout || o.err.status == http.StatusBadGateway {
				code = 2
			}
			offsets[i].ErrorCode, offsets[i].Error = &code, &msg
			continue
		}
		off := o.base + int64(index[i])
		offsets[i].Offset = &off
	}
	q.reply(http.StatusOK, mediaV2, map[string]any{"offsets": offsets, "key_schema_id": nil, "value_schema_id": nil})
}

// murmur2 is Kafka's default partitioner hash (the Java client's
// Utils.murmur2), so keyed records land where Kafka clients put them.
func murmur2(b []byte) uint32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	h := seed ^ uint32(len(b))
	for ; len(b) >= 4; b = b[4:] {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
