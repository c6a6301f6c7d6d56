package tiering

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

const (
	// DefaultS3PartSize is the multipart threshold and part size when
	// S3Config.PartSize is 0.
	DefaultS3PartSize = 16 << 20
	// MinS3PartSize is the smallest part S3 accepts (but for the last).
	MinS3PartSize = 5 << 20
	// maxS3Parts is S3's limit on parts in one multipart upload.
	maxS3Parts = 10000
	// maxS3PartSize bounds the part size asked for: each part is buffered
	// in memory (S3's own limit is 5 GiB).
	maxS3PartSize = 1 << 30
)

// S3Config selects a bucket (and key prefix) on S3 or an S3-compatible
// server. Everything left empty comes from the standard AWS settings
// (environment, shared config files, credential chain).
type S3Config struct {
	Bucket string
	// Prefix is put before every key, joined with "/".
	Prefix string
	// Endpoint is a custom endpoint URL, e.g. http://127.0.0.1:7070. Empty:
	// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / shared config, else AWS.
	Endpoint string
	// Region defaults to AWS_REGION (or the shared config), else us-east-1.
	Region string
	// PathStyle addresses the bucket in the path (http://host/bucket/key)
	// instead of the host name. It is forced on when the endpoint's host is
	// an IP address or localhost, where virtual-hosted style cannot work.
	PathStyle bool
	// AccessKey and SecretKey, if set, are used as static credentials;
	// otherwise the standard AWS credential chain is.
	AccessKey, SecretKey string
	// PartSize is the multipart threshold and part size (default 16 MiB,
	// at least 5 MiB). Objects larger than it are uploaded in parts.
	PartSize int64
	// ResponseTimeout bounds the wait for a response's headers once a
	// request is sent (default 30 s): a server that accepts and then hangs
	// fails that attempt, which is retried, instead of holding the call
	// until its context ends. Bodies are not bounded by it (large objects
	// take what they take).
	ResponseTimeout time.Duration
}

// ParseS3URL parses s3://bucket/prefix?endpoint=URL&region=R&path_style=true.
// The query parameters are optional (part_size=BYTES is accepted too);
// settings it does not give are left empty for NewS3 to take from the
// standard AWS environment (AWS_ENDPOINT_URL_S3, AWS_REGION, ...).
func ParseS3URL(u string) (S3Config, error) {
	var c S3Config
	pu, err := url.Parse(u)
	if err != nil {
		return c, fmt.Errorf("tiering: bad s3 url %q: %w", u, err)
	}
	if pu.Scheme != "s3" {
		return c, fmt.Errorf("tiering: bad s3 url %q: scheme is not s3", u)
	}
	if pu.User != nil || pu.Port() != "" || pu.Fragment != "" {
		return c, fmt.Errorf("tiering: bad s3 url %q: want s3://bucket/prefix?params", u)
	}
	c.Bucket = pu.Host
	if c.Bucket == "" {
		return c, fmt.Errorf("tiering: bad s3 url %q: no bucket", u)
	}
	c.Prefix = strings.Trim(pu.Path, "/")
	q, err := url.ParseQuery(pu.RawQuery)
	if err != nil {
		return c, fmt.Errorf("tiering: bad s3 url %q: %w", u, err)
	}
	for name, vals := range q {
		v := vals[len(vals)-1]
		switch name {
		case "endpoint":
			eu, err := url.Parse(v)
			if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
				return c, fmt.Errorf("tiering: bad s3 url %q: endpoint %q is not an http(s) URL", u, v)
			}
			c.Endpoint = v
		case "region":
			c.Region = v
		case "path_style":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return c, fmt.Errorf("tiering: bad s3 url %q: path_style=%q", u, v)
			}
			c.PathStyle = b
		case "part_size":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < MinS3PartSize || n > maxS3PartSize {
				return c, fmt.Errorf("tiering: bad s3 url %q: part_size=%q (want bytes in [%d, %d])", u, v, MinS3PartSize, int64(maxS3PartSize))
			}
			c.PartSize = n
		default:
			return c, fmt.Errorf("tiering: bad s3 url %q: unknown parameter %q", u, name)
		}
	}
	return c, nil
}

// S3 is an ObjectStore on an S3 bucket (aws-sdk-go-v2). It retries nothing
// itself beyond the SDK's default retryer.
type S3 struct {
	client   *s3.Client
	bucket   string
	prefix   string // "" or ends with "/"
	partSize int64
}

var _ ObjectStore = (*S3)(nil)

// NewS3 returns a store on c.Bucket. It does not contact the server.
func NewS3(ctx context.Context, c S3Config) (*S3, error) {
	if c.Bucket == "" {
		return nil, errors.New("tiering: s3: no bucket")
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		return nil, errors.New("tiering: s3: access key and secret key go together")
	}
	partSize := c.PartSize
	if partSize == 0 {
		partSize = DefaultS3PartSize
	}
	if partSize < MinS3PartSize || partSize > maxS3PartSize {
		return nil, fmt.Errorf("tiering: s3: part size %d outside S3's [%d, %d]", partSize, MinS3PartSize, int64(maxS3PartSize))
	}
	var opts []func(*config.LoadOptions) error
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	if c.AccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(c.AccessKey, c.SecretKey, "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tiering: s3: load aws config: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	respTimeout := c.ResponseTimeout
	if respTimeout <= 0 {
		respTimeout = 30 * time.Second
	}
	// On top of the client the default config built (it carries a custom
	// CA bundle, AWS_CA_BUNDLE or a profile's ca_bundle, if any).
	base, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient)
	if !ok || base == nil {
		base = awshttp.NewBuildableClient()
	}
	httpClient := base.
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second }).
		WithTransportOptions(func(tr *http.Transport) { tr.ResponseHeaderTimeout = respTimeout })
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.HTTPClient = httpClient
		// o.BaseEndpoint already holds what AWS_ENDPOINT_URL_S3 etc. say.
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
		}
		o.UsePathStyle = c.PathStyle || needsPathStyle(o.BaseEndpoint)
		// Whole-object GETs of multipart objects cannot be checked
		// against their composite checksum; the SDK would log a warning
		// for each. Tiering checks segment checksums itself.
		o.DisableLogOutputChecksumValidationSkipped = true
		// Chunk reads are checked against the manifest's chunk CRCs as
		// they arrive; left to its default, the SDK would hash a range
		// that happens to be a whole object (every chunk of a segment
		// smaller than a chunk) a second time. Whole-object reads ask for
		// the SDK's check themselves (GetRange).
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	prefix := strings.Trim(c.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3{client: client, bucket: c.Bucket, prefix: prefix, partSize: partSize}, nil
}

// needsPathStyle reports whether endpoint's host is an IP address or
// localhost, which cannot carry the bucket as a subdomain.
func needsPathStyle(endpoint *string) bool {
	if endpoint == nil || *endpoint == "" {
		return false
	}
	u, err := url.Parse(*endpoint)
	if err != nil {
		return false
	}
	h := u.Hostname()
	return h == "localhost" || net.ParseIP(h) != nil
}

// Client returns the underlying SDK client (for benchmarks and tools).
func (s *S3) Client() *s3.Client { return s.client }

// Bucket returns the bucket name.
func (s *S3) Bucket() string { return s.bucket }

// ObjectKey returns the full object key for key (with the prefix).
func (s *S3) ObjectKey(key string) string { return s.prefix + key }

// String describes the store as s3://bucket/prefix.
func (s *S3) String() string {
	return "s3://" + s.bucket + "/" + strings.TrimSuffix(s.prefix, "/")
}

func (s *S3) checkKey(op, key string) error {
	if key == "" || strings.HasPrefix(key, "/") {
		return fmt.Errorf("s3 %s: invalid key %q", op, key)
	}
	return nil
}

// s3Err wraps err from op on key, adding ErrNotFound, ErrExists or
// ErrBadRange where the S3 error means that (sentinel and cause both stay
// reachable with errors.Is/As).
func (s *S3) s3Err(op, key string, err error) error {
	var sentinel error
	code, status := "", 0
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	switch {
	case code == "NoSuchKey" || (op == "head" && status == http.StatusNotFound && code != "NoSuchBucket"):
		// Only an answer about the key: any other 404 (a wrong endpoint, a
		// proxy, a missing bucket) is an error, never "no manifest here"
		// (a restore would start empty and then mirror over the bucket).
		sentinel = ErrNotFound
	case op == "put-if-absent" && (status == http.StatusPreconditionFailed || code == "PreconditionFailed"):
		// (409 ConditionalRequestConflict is a race to retry, not an answer.)
		sentinel = ErrExists
	case status == http.StatusRequestedRangeNotSatisfiable || code == "InvalidRange":
		sentinel = ErrBadRange
	}
	where := fmt.Sprintf("s3 %s s3://%s/%s", op, s.bucket, s.prefix+key)
	if sentinel != nil {
		return fmt.Errorf("%s: %w: %w", where, sentinel, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// Put implements ObjectStore: one PutObject up to the part size, a
// multipart upload above it.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, "put", key, r, size)
}

// PutIfAbsent implements ObjectStore with If-None-Match: * (on PutObject or
// on CompleteMultipartUpload).
func (s *S3) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, "put-if-absent", key, r, size)
}

func (s *S3) put(ctx context.Context, op, key string, r io.Reader, size int64) error {
	if err := s.checkKey(op, key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("s3 %s %q: negative size %d", op, key, size)
	}
	var ifNoneMatch *string
	if op == "put-if-absent" {
		ifNoneMatch = aws.String("*")
	}
	if size > s.partSize {
		return s.putMultipart(ctx, op, key, r, size, ifNoneMatch)
	}
	// The body is buffered (in a pooled buffer) so it can be re-sent by the
	// SDK's retries and written to the socket in one call, and it carries
	// our CRC-32C, which the server verifies: the SDK then hashes nothing
	// (its own default, a CRC32 pass plus a SHA-256 one, was the uploader's
	// main CPU cost).
	bp := getBodyBuf(size)
	buf := (*bp)[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		putBodyBuf(bp)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("s3 %s %q: read body (%d bytes): %w", op, key, size, err)
	}
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:         aws.String(s.bucket),
		Key:            aws.String(s.prefix + key),
		Body:           bytes.NewReader(buf),
		ContentLength:  aws.Int64(size),
		IfNoneMatch:    ifNoneMatch,
		ChecksumCRC32C: crc32cHeader(buf, r),
	}, unsignedPayload)
	if err != nil {
		// Not recycled: after a failure the transport may still be
		// sending the body from another goroutine.
		return s.s3Err(op, key, err)
	}
	putBodyBuf(bp)
	return nil
}

// crc32cHeader is the base64 of a body's big-endian CRC-32C, as S3's
// x-amz-checksum-crc32c carries it: the one the uploader already computed
// if r is its crc32cBody, else computed from b.
func crc32cHeader(b []byte, r io.Reader) *string {
	var sum [4]byte
	if cb, ok := r.(*crc32cBody); ok {
		binary.BigEndian.PutUint32(sum[:], cb.sum)
	} else {
		binary.BigEndian.PutUint32(sum[:], crc32.Checksum(b, castagnoli))
	}
	return aws.String(base64.StdEncoding.EncodeToString(sum[:]))
}

// bodyBufs recycles upload body buffers (up to the part size each).
var bodyBufs sync.Pool

func getBodyBuf(n int64) *[]byte {
	if bp, ok := bodyBufs.Get().(*[]byte); ok && int64(cap(*bp)) >= n {
		return bp
	}
	b := make([]byte, n)
	return &b
}

func putBodyBuf(bp *[]byte) {
	if cap(*bp) >= 1<<20 { // small ones (indexes, manifests) are not worth keeping
		bodyBufs.Put(bp)
	}
}

func (s *S3) putMultipart(ctx context.Context, op, key string, r io.Reader, size int64, ifNoneMatch *string) (err error) {
	partSize := s.partSize
	if (size+partSize-1)/partSize > maxS3Parts {
		partSize = (size + maxS3Parts - 1) / maxS3Parts
	}
	full := aws.String(s.prefix + key)
	cr, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket:            aws.String(s.bucket),
		Key:               full,
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
	})
	if err != nil {
		return s.s3Err(op+" (create multipart)", key, err)
	}
	uploadID := cr.UploadId
	defer func() {
		if err == nil {
			return
		}
		// Best effort, even if ctx is what failed.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		// (If this fails too, the next orphan sweep's AbortUploads ends it.)
		_, _ = s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
			Bucket:   aws.String(s.bucket),
			Key:      full,
			UploadId: uploadID,
		})
	}()
	bp := getBodyBuf(partSize)
	buf := (*bp)[:partSize]
	recycle := true // false once a part failed: its body may still be in use
	defer func() {
		if recycle {
			putBodyBuf(bp)
		}
	}()
	var parts []types.CompletedPart
	var whole uint32 // of everything sent, for a body whose sum is known
	cb, known := r.(*crc32cBody)
	for off, num := int64(0), int32(1); off < size; off, num = off+partSize, num+1 {
		n := min(partSize, size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("s3 %s %q: read body at %d of %d: %w", op, key, off, size, err)
		}
		partSum := crc32cHeader(buf[:n], nil)
		if known {
			whole = crc32.Update(whole, castagnoli, buf[:n])
		}
		up, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket:         aws.String(s.bucket),
			Key:            full,
			UploadId:       uploadID,
			PartNumber:     aws.Int32(num),
			Body:           bytes.NewReader(buf[:n]),
			ContentLength:  aws.Int64(n),
			ChecksumCRC32C: partSum,
		}, unsignedPayload)
		if err != nil {
			recycle = false
			return s.s3Err(fmt.Sprintf("%s (part %d)", op, num), key, err)
		}
		sum := up.ChecksumCRC32C
		if sum == nil { // a server that does not echo it: the one we sent
			sum = partSum
		}
		parts = append(parts, types.CompletedPart{
			ETag:           up.ETag,
			PartNumber:     aws.Int32(num),
			ChecksumCRC32C: sum,
		})
	}
	if known && whole != cb.sum {
		// Each part's CRC guards its transfer only. The bytes read for the
		// upload are not the ones the manifest's checksum was computed
		// from: never complete an object the manifest would then vouch for.
		return fmt.Errorf("s3 %s %q: the body read for the upload (crc32c %08x) is not the one checksummed before (%08x)", op, key, whole, cb.sum)
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket:          aws.String(s.bucket),
		Key:             full,
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		IfNoneMatch:     ifNoneMatch,
	})
	if err != nil {
		return s.s3Err(op, key, err)
	}
	return nil
}

// GetRange implements ObjectStore with a ranged GetObject.
func (s *S3) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := s.checkKey("get", key); err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("s3 get %q: offset %d: %w", key, off, ErrBadRange)
	}
	if n == 0 {
		// No byte range is empty in HTTP: check with HEAD.
		size, err := s.size(ctx, key)
		if err != nil {
			return nil, err
		}
		if _, err := checkRange(key, size, off, 0); err != nil {
			return nil, fmt.Errorf("s3 %w", err)
		}
		return []byte{}, nil
	}
	if n > 0 {
		buf := make([]byte, n)
		if err := s.getInto(ctx, key, off, buf, nil); err != nil {
			return nil, err
		}
		return buf, nil
	}
	// To the end. (From 0 it sends no Range: a range of an empty object is
	// 416.)
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)}
	if off > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", off))
	} else {
		in.ChecksumMode = types.ChecksumModeEnabled // checked against the object's stored checksum
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		err = s.s3Err("get", key, err)
		if errors.Is(err, ErrBadRange) {
			// Reading from the very end is not past it.
			size, herr := s.size(ctx, key)
			if herr == nil && size == off {
				return []byte{}, nil
			}
		}
		return nil, err
	}
	defer out.Body.Close()
	if in.Range != nil {
		if err := s.checkContentRange(in, out, off); err != nil {
			return nil, err
		}
	}
	size := aws.ToInt64(out.ContentLength)
	if size > maxWholeObject {
		return nil, fmt.Errorf("s3 get %q from %d: %d bytes: %w", key, off, size, ErrTooLarge)
	}
	// Room for what the length header claims only up to 64 MiB: beyond
	// that the buffer grows with the bytes that actually come.
	b := bytes.NewBuffer(make([]byte, 0, min(max(size, 0), 64<<20)))
	// Bounded whatever the length header said (or if it said nothing).
	if _, err := b.ReadFrom(io.LimitReader(out.Body, maxWholeObject+1)); err != nil {
		return nil, s.s3Err("get", key, err)
	}
	if int64(b.Len()) > maxWholeObject {
		return nil, fmt.Errorf("s3 get %q from %d: over %d bytes: %w", key, off, maxWholeObject, ErrTooLarge)
	}
	return b.Bytes(), nil
}

// GetRangeInto implements RangeReader with a ranged GetObject read straight
// into dst.
func (s *S3) GetRangeInto(ctx context.Context, key string, off int64, dst []byte, onRead func(int, []byte)) error {
	if len(dst) == 0 || off < 0 {
		_, err := s.GetRange(ctx, key, off, int64(len(dst)))
		return err
	}
	if err := s.checkKey("get", key); err != nil {
		return err
	}
	return s.getInto(ctx, key, off, dst, onRead)
}

// getInto reads the len(dst) > 0 bytes of key at off >= 0 with a ranged
// GetObject, handing each 256 KiB piece to onRead (if not nil) as it
// arrives.
func (s *S3) getInto(ctx context.Context, key string, off int64, dst []byte, onRead func(int, []byte)) error {
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+int64(len(dst))-1))}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return s.s3Err("get", key, err)
	}
	defer out.Body.Close()
	if err := s.checkContentRange(in, out, off); err != nil {
		return err
	}
	if out.ContentLength != nil && *out.ContentLength < int64(len(dst)) {
		// The server clipped the range at the end of the object.
		return fmt.Errorf("s3 get %q [%d,+%d): got %d bytes: %w", key, off, len(dst), *out.ContentLength, ErrBadRange)
	}
	// From here a short body is a cut connection, which is retried (not a
	// bad range, which is final).
	body := &shortIsTransient{out.Body}
	if onRead == nil {
		return s.readBodyInto(body, key, off, dst)
	}
	// In steps, each handed to onRead while still in the processor's cache.
	const step = 256 << 10
	for at := 0; at < len(dst); at += step {
		piece := dst[at:min(at+step, len(dst))]
		if err := s.readBodyInto(body, key, off+int64(at), piece); err != nil {
			return err
		}
		onRead(at, piece)
	}
	return nil
}

// checkContentRange makes sure a ranged GET's answer starts at off: never
// take a whole object (a server ignoring Range) for a range.
func (s *S3) checkContentRange(in *s3.GetObjectInput, out *s3.GetObjectOutput, off int64) error {
	var start int64
	cr := aws.ToString(out.ContentRange)
	if _, err := fmt.Sscanf(cr, "bytes %d-", &start); err != nil || start != off {
		return fmt.Errorf("s3 get s3://%s/%s: asked %s, got Content-Range %q", s.bucket, aws.ToString(in.Key), aws.ToString(in.Range), cr)
	}
	return nil
}

// shortIsTransient turns the early end of a body whose length was checked
// into an error that is retried: the connection was cut.
type shortIsTransient struct{ r io.Reader }

var errBodyCut = errors.New("response body cut short")

func (b *shortIsTransient) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) { // net/http: a body short of its Content-Length
		err = errBodyCut
	}
	return n, err
}

// readBodyInto reads exactly len(dst) bytes of a ranged GET's body.
func (s *S3) readBodyInto(body io.Reader, key string, off int64, dst []byte) error {
	got, err := io.ReadFull(body, dst)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		// The server clipped the range at the end of the object.
		return fmt.Errorf("s3 get %q [%d,+%d): got %d bytes: %w", key, off, len(dst), got, ErrBadRange)
	}
	if err != nil {
		return s.s3Err("get", key, err)
	}
	return nil
}

// size returns the object's size with HeadObject.
func (s *S3) size(ctx context.Context, key string) (int64, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.prefix + key),
	})
	if err != nil {
		return 0, s.s3Err("head", key, err)
	}
	return aws.ToInt64(out.ContentLength), nil
}

// Delete implements ObjectStore.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := s.checkKey("delete", key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.prefix + key),
	})
	if err != nil {
		err = s.s3Err("delete", key, err)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	return nil
}

// List implements ObjectStore with ListObjectsV2; keys come back without
// the store's prefix.
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix + prefix),
	})
	var keys []string
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s.s3Err("list", prefix, err)
		}
		for _, o := range page.Contents {
			k := aws.ToString(o.Key)
			if !strings.HasPrefix(k, s.prefix) {
				continue
			}
			keys = append(keys, k[len(s.prefix):])
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// tierKey matches the keys the tier writes under its prefix: segment
// objects (<topic>-<id>/<partition>/<base>.log|.index|.timeindex|.txnindex) and
// metadata under _synapse/.
var tierKey = regexp.MustCompile(`^(_synapse/.+|[a-zA-Z0-9._-]+-[0-9a-f]{32}/[0-9]+/[0-9]{20}\.(log|index|timeindex|txnindex))$`)

// AbortUploads implements UploadAborter: it aborts the multipart uploads
// of the tier's own keys under the prefix that an interrupted Put left (a
// crash, a lost answer, an abort that failed too).
func (s *S3) AbortUploads(ctx context.Context) (int, error) {
	p := s3.NewListMultipartUploadsPaginator(s.client, &s3.ListMultipartUploadsInput{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix),
	})
	n := 0
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return n, s.s3Err("list multipart uploads", "", err)
		}
		for _, u := range page.Uploads {
			key, ok := strings.CutPrefix(aws.ToString(u.Key), s.prefix)
			if !ok || !tierKey.MatchString(key) {
				continue // not one of ours (other software may share the bucket)
			}
			_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
				Bucket: aws.String(s.bucket), Key: u.Key, UploadId: u.UploadId,
			})
			var ae smithy.APIError
			if errors.As(err, &ae) && ae.ErrorCode() == "NoSuchUpload" {
				continue // gone meanwhile
			}
			if err != nil {
				return n, s.s3Err("abort multipart upload", key, err)
			}
			n++
		}
	}
	return n, nil
}

// unsignedPayload signs requests without hashing the body (SigV4
// UNSIGNED-PAYLOAD): the body's integrity is carried by its CRC-32C checksum
// instead, and hashing every uploaded byte with SHA-256 was the uploader's
// main CPU cost.
func unsignedPayload(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
}
