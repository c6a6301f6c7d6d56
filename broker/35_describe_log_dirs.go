package broker

import (
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeLogDirs: v0-4
//
// Behavior:
//   - One log directory: the data directory (absolute path). Each
//     partition asked for (null topics: every partition) with the bytes of
//     its local segments; offset lag 0, never a future replica. Partitions
//     that do not exist are left out, as Kafka leaves them out.
//   - With ACLs: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED
//     (v3+ at the top; below, an empty answer, as Kafka).
//
// Version notes:
//   - v4+: the file system's total and usable bytes.
func (s *Server) handleDescribeLogDirs(c *conn, req *kmsg.DescribeLogDirsRequest) (kmsg.Response, error) {
	resp := req.ResponseKind().(*kmsg.DescribeLogDirsResponse)
	if !c.allowedCluster(opDescribe) {
		if req.Version >= 3 {
			resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		}
		return resp, nil
	}
	dir := kmsg.NewDescribeLogDirsResponseDir()
	dir.Dir, _ = filepath.Abs(s.cfg.DataDir)
	dir.TotalBytes, dir.UsableBytes = -1, -1
	if free, size, ok := diskFree(s.cfg.DataDir); ok {
		dir.TotalBytes, dir.UsableBytes = size, free
	}
	add := func(t *topic, parts []*partition) {
		if len(parts) == 0 {
			return
		}
		dt := kmsg.NewDescribeLogDirsResponseDirTopic()
		dt.Topic = t.name
		for _, p := range parts {
			dp := kmsg.NewDescribeLogDirsResponseDirTopicPartition()
			dp.Partition, dp.Size = p.index, p.log.LocalBytes()
			dt.Partitions = append(dt.Partitions, dp)
		}
		dir.Topics = append(dir.Topics, dt)
	}
	if req.Topics == nil {
		for _, t := range s.reg.all() {
			add(t, s.reg.partitionsOf(t))
		}
	} else {
		for _, rt := range req.Topics {
			t := s.reg.get(rt.Topic)
			if t == nil {
				continue
			}
			var parts []*partition
			for _, i := range rt.Partitions {
				if p := s.reg.partition(t, i); p != nil {
					parts = append(parts, p)
				}
			}
			add(t, parts)
		}
	}
	resp.Dirs = append(resp.Dirs, dir)
	return resp, nil
}
