package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Record formats of `synapse produce -f` and `synapse consume -f`, after
// kcat's -f and rpk's -f: literal text with %-directives and backslash
// escapes (\n \r \t \0 \\).
//
//	%t topic   %p partition   %o offset   %k key   %v (or %s) value
//	%h headers (k=v separated by commas)   %T timestamp (Unix ms)
//	%K key length   %S value length   %% a percent sign
//
// Produce reads %k, %v, %p and %T (each field runs up to the literal text
// after it, so two fields need text between them).

// fmtToken is a literal (verb 0) or a directive.
type fmtToken struct {
	verb byte
	lit  []byte
}

// unescape turns \n \r \t \0 \\ into their bytes.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 == len(s) {
			return "", fmt.Errorf("%q ends with a lone backslash", s)
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case '0':
			b.WriteByte(0)
		case '\\':
			b.WriteByte('\\')
		default:
			return "", fmt.Errorf("%q: unknown escape \\%c (\\n \\r \\t \\0 \\\\)", s, s[i])
		}
	}
	return b.String(), nil
}

// parseRecordFormat parses a format; verbs are the directives allowed.
func parseRecordFormat(f, verbs string) ([]fmtToken, error) {
	f, err := unescape(f)
	if err != nil {
		return nil, err
	}
	var toks []fmtToken
	lit := func(s string) {
		if n := len(toks); n > 0 && toks[n-1].verb == 0 {
			toks[n-1].lit = append(toks[n-1].lit, s...)
			return
		}
		toks = append(toks, fmtToken{lit: []byte(s)})
	}
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			lit(f[i : i+1])
			continue
		}
		if i+1 == len(f) {
			return nil, fmt.Errorf("format %q ends with a lone %%", f)
		}
		i++
		v := f[i]
		switch {
		case v == '%':
			lit("%")
		case v == 's':
			toks = append(toks, fmtToken{verb: 'v'})
		case strings.IndexByte(verbs, v) >= 0:
			toks = append(toks, fmtToken{verb: v})
		default:
			return nil, fmt.Errorf("format %q: %%%c is not one of %s", f, v, verbDoc(verbs))
		}
	}
	return toks, nil
}

func verbDoc(verbs string) string {
	var ds []string
	for _, v := range verbs {
		ds = append(ds, "%"+string(v))
	}
	return strings.Join(ds, " ")
}

// outputVerbs are what consume prints.
const outputVerbs = "tpokvhTKS"

// inputVerbs are what produce reads.
const inputVerbs = "kvpT"

// appendRecord formats r.
func appendRecord(b []byte, toks []fmtToken, r *kgo.Record) []byte {
	for _, t := range toks {
		switch t.verb {
		case 0:
			b = append(b, t.lit...)
		case 't':
			b = append(b, r.Topic...)
		case 'p':
			b = strconv.AppendInt(b, int64(r.Partition), 10)
		case 'o':
			b = strconv.AppendInt(b, r.Offset, 10)
		case 'k':
			b = append(b, r.Key...)
		case 'v':
			b = append(b, r.Value...)
		case 'K':
			b = strconv.AppendInt(b, int64(len(r.Key)), 10)
		case 'S':
			b = strconv.AppendInt(b, int64(len(r.Value)), 10)
		case 'T':
			b = strconv.AppendInt(b, r.Timestamp.UnixMilli(), 10)
		case 'h':
			for i, h := range r.Headers {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, h.Key...)
				b = append(b, '=')
				b = append(b, h.Value...)
			}
		}
	}
	return b
}

// jsonRecord is a consumed record as `consume --format json` prints it:
// key and value as text (null when absent; "_base64" twins instead when
// they are not UTF-8).
type jsonRecord struct {
	Topic       string       `json:"topic"`
	Partition   int32        `json:"partition"`
	Offset      int64        `json:"offset"`
	Timestamp   int64        `json:"timestamp"`
	Key         *string      `json:"key"`
	KeyBase64   []byte       `json:"key_base64,omitempty"`
	Value       *string      `json:"value"`
	ValueBase64 []byte       `json:"value_base64,omitempty"`
	Headers     []jsonHeader `json:"headers"`
}

type jsonHeader struct {
	Key   string  `json:"key"`
	Value *string `json:"value"`
}

func textOrBase64(b []byte) (*string, []byte) {
	if b == nil {
		return nil, nil
	}
	if !utf8.Valid(b) {
		return nil, b
	}
	s := string(b)
	return &s, nil
}

func toJSONRecord(r *kgo.Record) jsonRecord {
	j := jsonRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp.UnixMilli(), Headers: []jsonHeader{}}
	j.Key, j.KeyBase64 = textOrBase64(r.Key)
	j.Value, j.ValueBase64 = textOrBase64(r.Value)
	for _, h := range r.Headers {
		jh := jsonHeader{Key: h.Key}
		if h.Value != nil {
			v := string(h.Value)
			jh.Value = &v
		}
		j.Headers = append(j.Headers, jh)
	}
	return j
}

// recordReader reads records from input laid out as a format.
type recordReader struct {
	r    *bufio.Reader
	toks []fmtToken
	n    int // records read, for errors
}

func newRecordReader(r io.Reader, toks []fmtToken) (*recordReader, error) {
	for i := 1; i < len(toks); i++ {
		if toks[i].verb != 0 && toks[i-1].verb != 0 {
			return nil, fmt.Errorf("%%%c right after %%%c: fields need text between them to be read apart", toks[i].verb, toks[i-1].verb)
		}
	}
	hasValue := false
	for _, t := range toks {
		hasValue = hasValue || t.verb == 'v'
	}
	if !hasValue {
		return nil, errors.New("the input format reads no %v")
	}
	return &recordReader{r: bufio.NewReaderSize(r, 64<<10), toks: toks}, nil
}

// readUntil reads up to and past delim; what was before it is returned.
// At EOF it returns what it read with io.EOF.
func (rr *recordReader) readUntil(delim []byte) ([]byte, error) {
	if len(delim) == 0 {
		b, err := io.ReadAll(rr.r)
		if err == nil {
			err = io.EOF
		}
		return b, err
	}
	last := delim[len(delim)-1]
	var buf []byte
	for {
		chunk, err := rr.r.ReadSlice(last)
		buf = append(buf, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return buf, err
		}
		if bytes.HasSuffix(buf, delim) {
			return buf[:len(buf)-len(delim)], nil
		}
	}
}

// next reads one record; io.EOF when the input ended before one started.
// The last record may lack the format's trailing text (a file without a
// final newline).
func (rr *recordReader) next() (*kgo.Record, error) {
	rec := &kgo.Record{Partition: -1}
	started := false
	last := len(rr.toks) - 1
	for i := 0; i <= last; {
		t := rr.toks[i]
		if t.verb == 0 {
			got := make([]byte, len(t.lit))
			n, err := io.ReadFull(rr.r, got)
			if n == 0 && err != nil {
				switch {
				case !started:
					return nil, io.EOF
				case i == last:
					rr.n++
					return rec, nil
				}
				return nil, fmt.Errorf("record %d: the input ended inside it", rr.n+1)
			}
			if err != nil || !bytes.Equal(got, t.lit) {
				return nil, fmt.Errorf("record %d: want %q, read %q", rr.n+1, t.lit, got[:n])
			}
			started = true
			i++
			continue
		}
		var delim []byte
		if i < last {
			delim = rr.toks[i+1].lit
		}
		field, err := rr.readUntil(delim)
		if err != nil && err != io.EOF {
			return nil, err
		}
		if err == io.EOF {
			if !started && len(field) == 0 {
				return nil, io.EOF
			}
			if i+1 < last {
				return nil, fmt.Errorf("record %d: the input ended inside it", rr.n+1)
			}
		}
		if err := setField(rec, t.verb, field); err != nil {
			return nil, fmt.Errorf("record %d: %w", rr.n+1, err)
		}
		if err == io.EOF {
			break
		}
		started = true
		i += 2 // the field and the text after it
	}
	rr.n++
	return rec, nil
}

func setField(rec *kgo.Record, verb byte, field []byte) error {
	switch verb {
	case 'k':
		rec.Key = bytes.Clone(field)
	case 'v':
		rec.Value = bytes.Clone(field)
	case 'p':
		p, err := strconv.ParseInt(string(field), 10, 32)
		if err != nil || p < 0 {
			return fmt.Errorf("partition %q: not a partition number", field)
		}
		rec.Partition = int32(p)
	case 'T':
		ms, err := strconv.ParseInt(string(field), 10, 64)
		if err != nil {
			return fmt.Errorf("timestamp %q: not Unix milliseconds", field)
		}
		rec.Timestamp = time.UnixMilli(ms)
	}
	return nil
}
