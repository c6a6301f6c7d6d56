package tiering

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func TestParseS3URL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want S3Config
	}{
		{"s3://bkt", S3Config{Bucket: "bkt"}},
		{"s3://bkt/", S3Config{Bucket: "bkt"}},
		{"s3://bkt/some/prefix/", S3Config{Bucket: "bkt", Prefix: "some/prefix"}},
		{"s3://bkt/p?endpoint=http://127.0.0.1:7070&region=eu-west-1&path_style=true",
			S3Config{Bucket: "bkt", Prefix: "p", Endpoint: "http://127.0.0.1:7070", Region: "eu-west-1", PathStyle: true}},
		{"s3://bkt/p?endpoint=https%3A%2F%2Fs3.example.com&path_style=0&part_size=8388608",
			S3Config{Bucket: "bkt", Prefix: "p", Endpoint: "https://s3.example.com", PartSize: 8 << 20}},
	} {
		got, err := ParseS3URL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseS3URL(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{
		"", "bkt/p", "file:///x", "s3:///p", "s3://bkt/p?path_style=maybe", "s3://bkt/p?endpoint=127.0.0.1:9000",
		"s3://bkt/p?bogus=1", "s3://bkt/p?part_size=1024", "s3://user@bkt/p", "s3://bkt:99/p", "s3://bkt/p%zz",
	} {
		if c, err := ParseS3URL(bad); err == nil {
			t.Errorf("ParseS3URL(%q) = %+v, want an error", bad, c)
		}
	}
}

func TestNewS3Config(t *testing.T) {
	ctx := context.Background()
	for _, c := range []S3Config{
		{},
		{Bucket: "b", AccessKey: "k"},
		{Bucket: "b", SecretKey: "s"},
		{Bucket: "b", PartSize: MinS3PartSize - 1},
	} {
		if _, err := NewS3(ctx, c); err == nil {
			t.Errorf("NewS3(%+v) succeeded", c)
		}
	}
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	s, err := NewS3(ctx, S3Config{Bucket: "b", Prefix: "/x/y/", Endpoint: "http://localhost:1", AccessKey: "k", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	o := s.Client().Options()
	if o.Region != "us-east-1" || !o.UsePathStyle || aws.ToString(o.BaseEndpoint) != "http://localhost:1" {
		t.Fatalf("options: region %q path style %v endpoint %q", o.Region, o.UsePathStyle, aws.ToString(o.BaseEndpoint))
	}
	if s.ObjectKey("k") != "x/y/k" || s.String() != "s3://b/x/y" || s.Bucket() != "b" {
		t.Fatalf("prefix handling: %q %q", s.ObjectKey("k"), s.String())
	}
	// A host name endpoint keeps virtual-hosted style unless asked.
	s, err = NewS3(ctx, S3Config{Bucket: "b", Endpoint: "https://s3.example.com", Region: "eu-west-3"})
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Client().Options(); o.UsePathStyle || o.Region != "eu-west-3" {
		t.Fatalf("options: region %q path style %v", o.Region, o.UsePathStyle)
	}
}

func TestS3Store(t *testing.T) {
	v := runVersitygw(t)
	testObjectStore(t, v.Store("", "tier/prefix"))
}

// TestS3StoreNoPrefix runs the conformance test at the root of a bucket.
func TestS3StoreNoPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	v := runVersitygw(t)
	v.CreateBucket("noprefix")
	testObjectStore(t, v.Store("noprefix", ""))
}

func TestS3Prefixes(t *testing.T) {
	v := runVersitygw(t)
	ctx := context.Background()
	a, b, root := v.Store("", "a"), v.Store("", "a2/"), v.Store("", "")
	for _, s := range []*S3{a, b} {
		if err := s.Put(ctx, "k/1", strings.NewReader(s.String()), int64(len(s.String()))); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*S3{a, b} {
		keys, err := s.List(ctx, "")
		if err != nil || !slices.Equal(keys, []string{"k/1"}) {
			t.Fatalf("%s List: %q, %v", s, keys, err)
		}
		got, err := s.GetRange(ctx, "k/1", 0, -1)
		if err != nil || string(got) != s.String() {
			t.Fatalf("%s GetRange: %q, %v", s, got, err)
		}
	}
	keys, err := root.List(ctx, "")
	if err != nil || !slices.Equal(keys, []string{"a/k/1", "a2/k/1"}) {
		t.Fatalf("root List: %q, %v", keys, err)
	}
	// The objects are really there under the full key.
	out, err := root.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(v.Bucket()), Key: aws.String(a.ObjectKey("k/1"))})
	if err != nil || aws.ToInt64(out.ContentLength) != int64(len(a.String())) {
		t.Fatalf("HeadObject %s: %v", a.ObjectKey("k/1"), err)
	}
}

// TestS3MissingBucket: a missing bucket is an error, never ErrNotFound
// (which would make a reader think an object is gone).
func TestS3MissingBucket(t *testing.T) {
	v := runVersitygw(t)
	ctx := context.Background()
	s := v.Store("no-such-bucket", "")
	if _, err := s.GetRange(ctx, "k", 0, -1); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRange in a missing bucket: %v", err)
	}
	if _, err := s.GetRange(ctx, "k", 0, 10); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRange in a missing bucket: %v", err)
	}
	if err := s.Put(ctx, "k", strings.NewReader("x"), 1); err == nil {
		t.Fatal("Put in a missing bucket succeeded")
	}
	if _, err := s.List(ctx, ""); err == nil {
		t.Fatal("List in a missing bucket succeeded")
	}
}

// TestS3FromEnvironment configures the store the way `--tier s3://...`
// does with nothing but standard AWS environment variables.
func TestS3FromEnvironment(t *testing.T) {
	endpoint := startVersitygw(t)
	t.Setenv("AWS_ENDPOINT_URL_S3", endpoint)
	t.Setenv("AWS_REGION", versitygwRegion)
	t.Setenv("AWS_ACCESS_KEY_ID", versitygwAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", versitygwSecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	c, err := ParseS3URL("s3://" + versitygwBucket + "/env")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := NewS3(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Client().Options().UsePathStyle {
		t.Fatal("loopback endpoint from the environment did not force path style")
	}
	if err := s.Put(ctx, "k", strings.NewReader("env"), 3); err != nil {
		t.Fatal(err)
	}
	root, err := NewS3(ctx, S3Config{Bucket: versitygwBucket, Endpoint: endpoint,
		AccessKey: versitygwAccessKey, SecretKey: versitygwSecretKey})
	if err != nil {
		t.Fatal(err)
	}
	got, err := root.GetRange(ctx, "env/k", 0, -1)
	if err != nil || string(got) != "env" {
		t.Fatalf("object through the environment config: %q, %v", got, err)
	}
	// The URL's query wins over the environment.
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
	c, err = ParseS3URL("s3://" + versitygwBucket + "/env?endpoint=" + endpoint + "&region=" + versitygwRegion)
	if err != nil {
		t.Fatal(err)
	}
	s, err = NewS3(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetRange(ctx, "k", 0, -1); err != nil || string(got) != "env" {
		t.Fatalf("object through the URL config: %q, %v", got, err)
	}
}

// TestS3Outage: with the server down operations fail (not ErrNotFound), and
// work again when it is back on the same port with the same data.
func TestS3Outage(t *testing.T) {
	v := runVersitygw(t)
	ctx := context.Background()
	s := v.Store("", "outage")
	if err := s.Put(ctx, "k", bytes.NewReader([]byte("before")), 6); err != nil {
		t.Fatal(err)
	}
	v.Stop()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Put(octx, "k2", bytes.NewReader([]byte("during")), 6); err == nil {
		t.Fatal("Put with the server down succeeded")
	}
	if _, err := s.GetRange(octx, "k", 0, -1); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRange with the server down: %v", err)
	}
	v.Start()
	got, err := s.GetRange(ctx, "k", 0, -1)
	if err != nil || string(got) != "before" {
		t.Fatalf("after restart: %q, %v", got, err)
	}
	if err := s.Put(ctx, "k2", bytes.NewReader([]byte("after")), 5); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
}

// TestS3Multipart checks that objects above the part size really go up in
// parts (the ETag of a multipart object ends in -<parts>) and come back
// whole, and that the part size is the threshold.
func TestS3Multipart(t *testing.T) {
	v := runVersitygw(t)
	ctx := context.Background()
	s := v.Store("", "mp")
	for _, tc := range []struct {
		size  int
		parts string // "" = single PutObject
	}{
		{MinS3PartSize, ""},
		{MinS3PartSize + 1, "-2"},
		{3*MinS3PartSize + 7, "-4"},
	} {
		data := randBytes(uint64(tc.size), tc.size)
		if err := s.Put(ctx, "obj", onlyReader{bytes.NewReader(data)}, int64(tc.size)); err != nil {
			t.Fatalf("Put %d bytes: %v", tc.size, err)
		}
		out, err := s.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.Bucket()), Key: aws.String(s.ObjectKey("obj"))})
		if err != nil {
			t.Fatal(err)
		}
		etag := strings.Trim(aws.ToString(out.ETag), `"`)
		if tc.parts == "" && strings.Contains(etag, "-") || tc.parts != "" && !strings.HasSuffix(etag, tc.parts) {
			t.Fatalf("%d bytes: ETag %q, want parts %q", tc.size, etag, tc.parts)
		}
		got, err := s.GetRange(ctx, "obj", 0, -1)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: read back %d bytes, %v", tc.size, len(got), err)
		}
	}
	// A conditional create in parts: the first one lands, a second one
	// finds the object there and changes nothing.
	big := randBytes(7, MinS3PartSize+1)
	if err := s.PutIfAbsent(ctx, "once", onlyReader{bytes.NewReader(big)}, int64(len(big))); err != nil {
		t.Fatalf("multipart PutIfAbsent: %v", err)
	}
	other := randBytes(8, MinS3PartSize+1)
	if err := s.PutIfAbsent(ctx, "once", onlyReader{bytes.NewReader(other)}, int64(len(other))); !errors.Is(err, ErrExists) {
		t.Fatalf("second multipart PutIfAbsent: %v, want ErrExists", err)
	}
	if got, err := s.GetRange(ctx, "once", 0, -1); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("after a refused PutIfAbsent: %d bytes, %v", len(got), err)
	}
	// A failed multipart Put leaves no upload behind.
	err := s.Put(ctx, "short", onlyReader{bytes.NewReader(make([]byte, MinS3PartSize+10))}, 2*MinS3PartSize)
	if err == nil {
		t.Fatal("short multipart Put succeeded")
	}
	ups, err := s.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(s.Bucket())})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups.Uploads) != 0 {
		t.Fatalf("%d multipart uploads left after a failed Put", len(ups.Uploads))
	}
	// A body whose bytes are not those its known checksum was computed
	// from (the segment read differently by the upload pass) is never
	// completed: each part's own CRC only guards its transfer.
	seg := randBytes(9, 2*MinS3PartSize+5)
	wrong := &crc32cBody{io.NewSectionReader(bytes.NewReader(seg), 0, int64(len(seg))), crc32.Checksum(seg, castagnoli) ^ 1}
	if err := s.Put(ctx, "mismatch", wrong, int64(len(seg))); err == nil {
		t.Fatal("multipart Put of a body that is not the checksummed one succeeded")
	}
	if _, err := s.GetRange(ctx, "mismatch", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("object after a refused multipart Put: %v", err)
	}
	right := &crc32cBody{io.NewSectionReader(bytes.NewReader(seg), 0, int64(len(seg))), crc32.Checksum(seg, castagnoli)}
	if err := s.Put(ctx, "match", right, int64(len(seg))); err != nil {
		t.Fatalf("multipart Put of the checksummed body: %v", err)
	}

	// Uploads an interrupted Put left are aborted by AbortUploads: those
	// of the tier's own keys under the store's prefix only (other software
	// may share the bucket, and the prefix).
	segKey := PartitionKey{Topic: "t", Partition: 3}.segmentKey(42, ".log")
	elsewhere := v.Store("", "elsewhere")
	for _, up := range []struct {
		st  *S3
		key string
	}{{s, segKey}, {s, "not-ours/backup.tar"}, {elsewhere, segKey}} {
		full := aws.String(up.st.ObjectKey(up.key))
		cr, err := up.st.Client().CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(up.st.Bucket()), Key: full})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := up.st.Client().UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(up.st.Bucket()), Key: full,
			UploadId: cr.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader(make([]byte, 1000))}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := Retrying(s, 3).(UploadAborter).AbortUploads(ctx); err != nil || n != 1 {
		t.Fatalf("AbortUploads: %d aborted, %v; want 1", n, err)
	}
	ups, err = s.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(s.Bucket())})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, u := range ups.Uploads {
		left = append(left, aws.ToString(u.Key))
	}
	slices.Sort(left)
	want := []string{s.ObjectKey("not-ours/backup.tar"), elsewhere.ObjectKey(segKey)}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("uploads left: %q, want %q", left, want)
	}
}

// s3Serving returns an S3 store on bucket "b" of a test HTTP server
// answering every request with h.
func s3Serving(t *testing.T, h http.HandlerFunc) *S3 {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	st, err := NewS3(context.Background(), S3Config{Bucket: "b", Endpoint: srv.URL, AccessKey: "k", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestS3CutBodyIsRetried: a ranged GET whose body stops short of its
// Content-Length (a cut connection) is an error that Retrying retries, not
// a final bad range; a range the server clips at the object's end is a bad
// range at once.
func TestS3CutBodyIsRetried(t *testing.T) {
	obj := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	var gets atomic.Int32
	st := s3Serving(t, func(w http.ResponseWriter, r *http.Request) {
		var from, to int
		if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to); err != nil {
			http.Error(w, "want a range", http.StatusBadRequest)
			return
		}
		clipped := min(to, len(obj)-1)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, clipped, len(obj)))
		w.Header().Set("Content-Length", fmt.Sprint(clipped-from+1))
		w.WriteHeader(http.StatusPartialContent)
		body := obj[from : clipped+1]
		if gets.Add(1) == 1 {
			w.Write(body[:len(body)/2]) // then the connection drops
			panic(http.ErrAbortHandler)
		}
		w.Write(body)
	})
	ctx := context.Background()
	dst := make([]byte, 32<<10)
	if err := Retrying(st, 3).(RangeReader).GetRangeInto(ctx, "o", 1000, dst, nil); err != nil {
		t.Fatalf("cut body not retried: %v", err)
	}
	if !bytes.Equal(dst, obj[1000:1000+len(dst)]) || gets.Load() != 2 {
		t.Fatalf("after %d GETs: wrong bytes", gets.Load())
	}
	gets.Store(1) // no more cuts
	err := Retrying(st, 3).(RangeReader).GetRangeInto(ctx, "o", int64(len(obj))-100, dst, nil)
	if !errors.Is(err, ErrBadRange) || gets.Load() != 2 {
		t.Fatalf("clipped range: %v after %d GETs, want ErrBadRange after one", err, gets.Load()-1)
	}
}

// TestS3ChecksumChecks: a whole-object GET is checked against the checksum
// the server stores with the object (a mismatch is an error; this fails if
// GetRange stops asking for the check), while a chunk read leaves checking
// to the caller (the tier checks chunk CRCs itself) even when the range is
// the whole object and the server sends the object's checksum.
func TestS3ChecksumChecks(t *testing.T) {
	obj := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	bad := base64.StdEncoding.EncodeToString([]byte{1, 2, 3, 4}) // not obj's CRC-32C
	st := s3Serving(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-amz-checksum-crc32c", bad)
		w.Header().Set("Content-Length", fmt.Sprint(len(obj)))
		if r.Header.Get("Range") != "" {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(obj)-1, len(obj)))
			w.WriteHeader(http.StatusPartialContent)
		}
		w.Write(obj)
	})
	ctx := context.Background()
	if b, err := st.GetRange(ctx, "o", 0, -1); err == nil {
		t.Fatalf("whole-object GET with a wrong checksum: %d bytes, no error", len(b))
	}
	dst := make([]byte, len(obj))
	if err := st.GetRangeInto(ctx, "o", 0, dst, nil); err != nil || !bytes.Equal(dst, obj) {
		t.Fatalf("chunk read: %v", err)
	}
}

// TestS3HangingAndSlowDownAreRetried: a server answering 503 SlowDown (as
// S3 does when throttling), and one that accepts a request and then hangs,
// cost a retried attempt each (the hang bounded by ResponseTimeout), not
// the call: the GET gets its bytes.
func TestS3HangingAndSlowDownAreRetried(t *testing.T) {
	obj := []byte("the object's bytes")
	var calls atomic.Int32
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
		case 2:
			select { // hangs: no response headers
			case <-release:
			case <-r.Context().Done():
			}
		default:
			w.Header().Set("Content-Length", fmt.Sprint(len(obj)))
			w.Write(obj)
		}
	}))
	t.Cleanup(srv.Close)
	st, err := NewS3(context.Background(), S3Config{Bucket: "b", Endpoint: srv.URL, AccessKey: "k", SecretKey: "s",
		ResponseTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	got, err := Retrying(st, 5).GetRange(ctx, "o", 0, -1)
	if err != nil || !bytes.Equal(got, obj) {
		t.Fatalf("after %d requests: %q, %v", calls.Load(), got, err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d requests, want 3 (SlowDown, hang, answer)", n)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("took %v", took)
	}
}

// TestS3CustomCABundle: an endpoint whose certificate a private CA signed
// (self-hosted S3-compatible stores) works with AWS_CA_BUNDLE, as in the
// AWS tools: the store's own HTTP settings keep the bundle.
func TestS3CustomCABundle(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_CA_BUNDLE", ca)
	st, err := NewS3(context.Background(), S3Config{Bucket: "b", Endpoint: srv.URL, AccessKey: "k", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.GetRange(context.Background(), "o", 0, -1)
	if err != nil || string(got) != "ok" {
		t.Fatalf("GET over TLS with the CA bundle: %q, %v", got, err)
	}
}

// TestS3WholeObjectIsBounded: a read to the end of an object allocates by
// the Content-Length the server sends only up to maxWholeObject; past it
// (or past it with no length at all) the read is ErrTooLarge, final, not
// retried, and nothing of that size is allocated.
func TestS3WholeObjectIsBounded(t *testing.T) {
	defer func(m int64) { maxWholeObject = m }(maxWholeObject)
	maxWholeObject = 1 << 20
	var gets atomic.Int32
	st := s3Serving(t, func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		switch r.URL.Path {
		case "/b/lies": // claims a terabyte, sends 3 bytes
			w.Header().Set("Content-Length", fmt.Sprint(int64(1)<<40))
			w.Write([]byte("abc"))
		case "/b/long": // no length, more than the bound
			w.(http.Flusher).Flush()
			w.Write(make([]byte, maxWholeObject+4096))
		default:
			w.Write([]byte("small"))
		}
	})
	ctx := context.Background()
	for _, key := range []string{"lies", "long"} {
		gets.Store(0)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := Retrying(st, 3).GetRange(ctx, key, 0, -1)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTooLarge) || gets.Load() != 1 {
			t.Fatalf("%s: %d bytes, %v after %d GETs; want ErrTooLarge after one", key, len(b), err, gets.Load())
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Fatalf("%s: allocated %d bytes", key, grew)
		}
	}
	if b, err := st.GetRange(ctx, "small", 0, -1); err != nil || string(b) != "small" {
		t.Fatalf("small object: %q, %v", b, err)
	}
}

// TestS3OtherNotFoundIsNoAnswer: a 404 that is not S3 saying the key is
// missing (a wrong endpoint, a proxy's page) is an error, not ErrNotFound:
// a restore would otherwise start empty and then mirror over the bucket.
func TestS3OtherNotFoundIsNoAnswer(t *testing.T) {
	st := s3Serving(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "404 page not found", http.StatusNotFound)
	})
	ctx := context.Background()
	if _, err := st.GetRange(ctx, "_synapse/topics.json", 0, -1); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("a proxy's 404: %v, want an error that is not ErrNotFound", err)
	}
	missing := s3Serving(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>`)
	})
	if _, err := missing.GetRange(ctx, "_synapse/topics.json", 0, -1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("S3's NoSuchKey: %v, want ErrNotFound", err)
	}
}
