package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func frameOf(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

// request encodes a request frame the way a client does.
func request(req kmsg.Request, corr int32, clientID string) []byte {
	var b []byte
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, uint16(len(clientID)))
	b = append(b, clientID...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	return req.AppendTo(b)
}

func TestReadFrame(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, 200_000)
	got, err := ReadFrame(bytes.NewReader(frameOf(payload)), nil, 1<<20)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("ReadFrame: %v, %d bytes", err, len(got))
	}
	if _, err := ReadFrame(bytes.NewReader(frameOf(payload)), nil, 1000); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("over the cap: %v", err)
	}
	if _, err := ReadFrame(bytes.NewReader(frameOf([]byte{1, 2})), nil, 1000); !errors.Is(err, ErrFrameSize) {
		t.Fatalf("tiny frame: %v", err)
	}
	neg := []byte{0xff, 0xff, 0xff, 0xff}
	if _, err := ReadFrame(bytes.NewReader(neg), nil, 1000); !errors.Is(err, ErrFrameSize) {
		t.Fatalf("negative size: %v", err)
	}
	// A frame announcing 50 MB and delivering 10 bytes: the buffer grows
	// with the data, not with the claim.
	short := append(binary.BigEndian.AppendUint32(nil, 50<<20), make([]byte, 10)...)
	got, err = ReadFrame(bytes.NewReader(short), nil, 100<<20)
	if !errors.Is(err, io.ErrUnexpectedEOF) || cap(got) > 1<<20 {
		t.Fatalf("truncated big frame: %v, cap %d", err, cap(got))
	}
}

func TestParse(t *testing.T) {
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 12
	tp := kmsg.NewMetadataRequestTopic()
	tp.Topic = kmsg.StringPtr("orders")
	md.Topics = append(md.Topics, tp)
	req, err := Parse(request(md, 42, "cli"))
	if err != nil {
		t.Fatal(err)
	}
	got := req.Body.(*kmsg.MetadataRequest)
	if req.CorrelationID != 42 || req.ClientID != "cli" || req.Version != 12 || len(got.Topics) != 1 || *got.Topics[0].Topic != "orders" {
		t.Fatalf("parsed %+v %+v", req, got)
	}

	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 4
	b := request(av, 7, "x")
	binary.BigEndian.PutUint16(b[2:], 99) // a version nobody speaks
	req, err = Parse(b)
	if !errors.Is(err, ErrUnsupportedVersion) || req == nil || req.Key != 18 || req.CorrelationID != 7 {
		t.Fatalf("unsupported version: %v %+v", err, req)
	}
	binary.BigEndian.PutUint16(b[0:], 9999)
	if _, err := Parse(b); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	good := request(md, 1, "c")
	if _, err := Parse(good[:len(good)-3]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated body: %v", err)
	}
}

func TestAppendResponseHeader(t *testing.T) {
	av := kmsg.NewPtrApiVersionsResponse()
	av.Version = 4 // flexible body, but never a flexible header
	b := AppendResponse(nil, 5, av)
	if int(binary.BigEndian.Uint32(b)) != len(b)-4 || binary.BigEndian.Uint32(b[4:]) != 5 {
		t.Fatal("bad size or correlation id")
	}
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version = 4
	if err := r.ReadFrom(b[8:]); err != nil {
		t.Fatalf("ApiVersions header must not carry tags: %v", err)
	}
	md := kmsg.NewPtrMetadataResponse()
	md.Version = 12
	b = AppendResponse(nil, 5, md)
	if b[8] != 0 {
		t.Fatal("flexible response header lacks its tag byte")
	}
}

// FuzzParse: any frame either parses or fails with an error; never a panic.
func FuzzParse(f *testing.F) {
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 12
	f.Add(request(md, 1, "c"))
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 3
	f.Add(request(av, 1, "c"))
	pr := kmsg.NewPtrProduceRequest()
	pr.Version = 9
	f.Add(request(pr, 1, "c"))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := Parse(b)
		if err != nil {
			return
		}
		if req == nil || req.Body == nil {
			t.Fatal("nil request without error")
		}
		// Whatever parsed re-encodes to a request that parses to the same
		// encoding (nothing half-read is kept).
		enc := req.Body.AppendTo(nil)
		again, err := Parse(request(req.Body, req.CorrelationID, req.ClientID))
		if err != nil {
			t.Fatalf("re-encoded %s v%d does not parse: %v", kmsg.NameForKey(req.Key), req.Version, err)
		}
		if !bytes.Equal(again.Body.AppendTo(nil), enc) {
			t.Fatalf("%s v%d: re-encoding is not stable", kmsg.NameForKey(req.Key), req.Version)
		}
	})
}

// FuzzReadFrame: never reads past the announced size, never panics.
func FuzzReadFrame(f *testing.F) {
	f.Add(frameOf([]byte("12345678")))
	f.Add([]byte{0, 0, 0, 9, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ReadFrame(bytes.NewReader(b), nil, 1<<16)
		if err == nil && (len(got) < 8 || len(got) > 1<<16 || len(got) > len(b)-4) {
			t.Fatalf("frame of %d bytes from %d input bytes", len(got), len(b))
		}
	})
}

// TestNonProduceCap: requests other than Produce are refused above 8 MiB
// before kmsg decodes (and allocates for) them.
func TestNonProduceCap(t *testing.T) {
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 4
	for i := 0; i < 600_000; i++ {
		tp := kmsg.NewMetadataRequestTopic()
		tp.Topic = kmsg.StringPtr("some-topic-name")
		md.Topics = append(md.Topics, tp)
	}
	b := request(md, 1, "c")
	if len(b) <= maxNonProduceFrame {
		t.Fatalf("test request only %d bytes", len(b))
	}
	if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%d-byte metadata request: %v", len(b), err)
	}
}

// TestProduceEntriesCap: a Produce of more topic and partition entries than
// maxProduceEntries (a few bytes each on the wire, a struct each when
// decoded) is refused before decoding; a Produce within it, of any version
// and with records, decodes.
func TestProduceEntriesCap(t *testing.T) {
	partition := func(j int) int32 { return int32(j) }
	build := func(version int16, topics, parts int, records []byte) []byte {
		pr := kmsg.NewPtrProduceRequest()
		pr.Version, pr.Acks, pr.TimeoutMillis = version, -1, 1000
		for i := 0; i < topics; i++ {
			tp := kmsg.NewProduceRequestTopic()
			tp.Topic = "t"
			for j := 0; j < parts; j++ {
				p := kmsg.NewProduceRequestTopicPartition()
				p.Partition, p.Records = partition(j), records
				tp.Partitions = append(tp.Partitions, p)
			}
			pr.Topics = append(pr.Topics, tp)
		}
		return request(pr, 1, "c")
	}
	for _, v := range []int16{3, 8, 9, 12, 13} {
		if _, err := Parse(build(v, 3, 4, []byte("not decoded here"))); err != nil {
			t.Fatalf("v%d: a small produce: %v", v, err)
		}
		body := build(v, 3, 4, []byte("x"))[8+2+1:] // header: key, version, correlation id, client id "c"
		if v >= 9 {
			body = body[1:] // and its tags
		}
		if n, ok := produceEntries(body, v, v >= 9); !ok || n != 15 {
			t.Fatalf("v%d: counted %d entries (ok %v), want 15", v, n, ok)
		}
		for _, shape := range [][2]int{{maxProduceEntries + 1, 0}, {1, maxProduceEntries}, {2, maxProduceEntries / 2}} {
			if _, err := Parse(build(v, shape[0], shape[1], nil)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("v%d: %d topics of %d partitions: %v", v, shape[0], shape[1], err)
			}
		}
		// Partition -1 with null records and no tags reads, from the
		// middle of an entry, as a huge tag section: the count must stop
		// before reading on.
		partition = func(int) int32 { return -1 }
		if _, err := Parse(build(v, 1, maxProduceEntries+1, nil)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("v%d: %d partitions numbered -1: %v", v, maxProduceEntries+1, err)
		}
		partition = func(j int) int32 { return int32(j) }
	}
	// A declared count without the entries behind it (enough bytes for
	// kmsg's own check of 2 per topic): kmsg would allocate a struct for
	// each declared topic before finding them missing.
	b := build(3, 1, 1, make([]byte, 500_000))
	body := 8 + 2 + 1                                   // header: key, version, correlation id, client id "c"
	binary.BigEndian.PutUint32(b[body+2+2+4:], 200_000) // topics, after transactional id, acks, timeout
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Parse(b)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("v3: 200 000 topics declared, one sent: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Fatalf("v3: 200 000 topics declared, one sent: %d bytes allocated", grew)
	}
}
