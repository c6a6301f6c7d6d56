package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func readAll(t *testing.T, format, in string) ([]*kgo.Record, error) {
	t.Helper()
	toks, err := parseRecordFormat(format, inputVerbs)
	if err != nil {
		t.Fatalf("format %q: %v", format, err)
	}
	rr, err := newRecordReader(strings.NewReader(in), toks)
	if err != nil {
		t.Fatalf("format %q: %v", format, err)
	}
	var out []*kgo.Record
	for {
		r, err := rr.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
}

func TestRecordReaderFormats(t *testing.T) {
	for _, c := range []struct {
		format, in string
		want       []string // key=value@partition
		err        string
	}{
		{`%v\n`, "a\nb\n", []string{"=a@-1", "=b@-1"}, ""},
		{`%v\n`, "a\nb", []string{"=a@-1", "=b@-1"}, ""}, // no final newline
		{`%v\n`, "", nil, ""},
		{`%v\n`, "\n\n", []string{"=@-1", "=@-1"}, ""},
		{`%k %v\n`, "k1 v 1\nk2 v2\n", []string{"k1=v 1@-1", "k2=v2@-1"}, ""},
		{`%k::%v;;`, "a::b;;c::d;;", []string{"a=b@-1", "c=d@-1"}, ""},
		{`key=%k,p=%p,%v\n`, "key=x,p=3,hello\n", []string{"x=hello@3"}, ""},
		{`%k %v\n`, "only-key", nil, "ended inside"},
		{`[%v]\n`, "[a]\n(b)\n", []string{"=a@-1"}, `want "["`},
		{`%p %v\n`, "x v\n", nil, "not a partition"},
		{`%%%v\n`, "%a\n", []string{"=a@-1"}, ""},
	} {
		recs, err := readAll(t, c.format, c.in)
		var got []string
		for _, r := range recs {
			got = append(got, string(r.Key)+"="+string(r.Value)+"@"+itoa(int64(r.Partition)))
		}
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q on %q: error %v, want %q", c.format, c.in, err, c.err)
		}
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("%q on %q: %q, want %q", c.format, c.in, got, c.want)
		}
	}
	recs, err := readAll(t, `%T,%v\n`, "1700000000123,x\n")
	if err != nil || len(recs) != 1 || recs[0].Timestamp.UnixMilli() != 1700000000123 {
		t.Errorf("%%T: %v %v", recs, err)
	}
	for _, bad := range []string{`%k%v`, `%k\n`} {
		toks, err := parseRecordFormat(bad, inputVerbs)
		if err == nil {
			_, err = newRecordReader(strings.NewReader(""), toks)
		}
		if err == nil {
			t.Errorf("input format %q accepted", bad)
		}
	}
	if _, err := parseRecordFormat(`%o`, inputVerbs); err == nil {
		t.Errorf("input format %%o accepted")
	}
	if _, err := parseRecordFormat(`%v\x`, outputVerbs); err == nil {
		t.Error(`unknown escape \x accepted`)
	}
}

func TestAppendRecord(t *testing.T) {
	toks, err := parseRecordFormat(`%t/%p/%o %k=%s (%K,%S) [%h] %T%%\t\\\n`, outputVerbs)
	if err != nil {
		t.Fatal(err)
	}
	r := &kgo.Record{Topic: "t", Partition: 2, Offset: 9, Key: []byte("key"), Value: []byte("value"),
		Headers: []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "b"}}, Timestamp: time.UnixMilli(1700000000000)}
	if got, want := string(appendRecord(nil, toks, r)), "t/2/9 key=value (3,5) [a=1,b=] 1700000000000%\t\\\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	j := toJSONRecord(&kgo.Record{Value: []byte{0xff, 0}, Timestamp: time.UnixMilli(5)})
	if j.Key != nil || j.Value != nil || string(j.ValueBase64) != "\xff\x00" || j.Timestamp != 5 {
		t.Errorf("binary value: %+v", j)
	}
}

func TestParseOffsetSpec(t *testing.T) {
	for in, want := range map[string]offsetSpec{
		"start": {kind: 's'}, "beginning": {kind: 's'}, "end": {kind: 'e'}, "e": {kind: 'e'},
		"0": {kind: 'a'}, "42": {kind: 'a', n: 42}, "-5": {kind: 'r', n: 5},
		"@1700000000000": {kind: 't', n: 1700000000000}, "s@17": {kind: 't', n: 17},
	} {
		got, err := parseOffsetSpec(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "@", "@-1", "s@x", "1.5"} {
		if _, err := parseOffsetSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
