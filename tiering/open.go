package tiering

import (
	"context"
	"fmt"
	"strings"
)

// OpenURL opens the object store a --tier URL names: "none" (nil, nil),
// "file:///path" or "file://relative/path" (a local directory), or
// "s3://bucket/prefix?endpoint=...&region=...&path_style=true" (standard AWS
// settings fill in what the URL leaves out).
func OpenURL(ctx context.Context, u string) (ObjectStore, error) {
	switch {
	case u == "" || u == "none":
		return nil, nil
	case strings.HasPrefix(u, "file://"):
		return NewLocalDir(strings.TrimPrefix(u, "file://"))
	case strings.HasPrefix(u, "s3://"):
		cfg, err := ParseS3URL(u)
		if err != nil {
			return nil, err
		}
		return NewS3(ctx, cfg)
	}
	return nil, fmt.Errorf("tiering: --tier %q: want none, file://path or s3://bucket/prefix", u)
}
