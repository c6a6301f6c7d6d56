package broker

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/internal/parallel"
	"github.com/synapsebroker/synapse/log"
)

// topic is one topic: its id, configs and open partitions. partitions only
// grows (CreatePartitions); the slice is replaced, never mutated.
type topic struct {
	name       string
	id         [16]byte
	configs    map[string]string // only those set on the topic
	stamps     stampPolicy       // from configs (setConfigsLocked), for produce
	configGen  uint64            // bumped by setConfigsLocked (r.mu)
	partitions []*partition
	// meta is the Metadata partition list last built while every
	// partition was online (03_metadata.go); shared read-only by responses.
	meta atomic.Pointer[[]kmsg.MetadataResponseTopicPartition]
}

// setConfigsLocked sets t's configs and what produce derives from them.
// r.mu held, or t not yet shared.
func (t *topic) setConfigsLocked(configs map[string]string) {
	if configs == nil {
		configs = map[string]string{}
	}
	t.configs, t.stamps = configs, stampPolicyOf(configs)
	t.configGen++
}

// configGenOf returns how many times t's configs were set (a change makes
// its partitions due for tiering work at once).
func (r *registry) configGenOf(t *topic) uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return t.configGen
}

// partition is one partition of a topic: its log and producer state.
type partition struct {
	topic *topic
	index int32
	log   *log.Partition
	// mu serializes the idempotence check with the append it guards.
	mu        sync.Mutex
	producers map[int64]*producerState
	// tierMu keeps the tiering step and the log cleaner apart: an upload
	// reads segment files a clean would replace (cleaner.go).
	tierMu sync.Mutex
	// txnOpen: per producer with a transaction open here, its first
	// offset (txn_partition.go); under mu. firstOpen is the least of them
	// plus one (0: none), read without the lock by fetches.
	txnOpen   map[int64]int64
	firstOpen atomic.Int64
	// txnSeen: transactional batches or markers since the last durable
	// snapshot (beforeRelease).
	txnSeen atomic.Bool
	// orphanSince: when the maintenance loop first found an open
	// transaction here that no coordinator state holds (abortOrphans).
	orphanSince map[int64]time.Time
	// mirrorDue: the bucket's copy of the producer state is behind what
	// was uploaded (with tiering).
	mirrorDue atomic.Bool
	// tierIdle: the last maintenance pass found nothing to tier, as of
	// this state (tiering.go, tierIdle); nil: due.
	tierIdle atomic.Pointer[tierSig]
	// repl: cluster mode's replication state (cluster.go).
	repl partRepl
}

// registry is the persisted set of topics. Lock order: registry.mu before
// any partition's mu; never held across a partition append or a fetch wait.
type registry struct {
	dir    string
	store  *log.Store
	logger *zap.Logger
	// tiered: retention is applied by the tiering layer over the whole log
	// (local + bucket), so the log engine itself never deletes by retention.
	tiered bool
	// mirror, if set, is called with topics.json after every save (tiering
	// keeps a copy in the bucket for restores).
	mirror func([]byte)

	mu     sync.RWMutex
	topics map[string]*topic
	byID   map[[16]byte]*topic
	// deleting names topics whose partition files are being deleted: a
	// topic of the same name waits (its directories are the same).
	deleting map[string]bool
}

const topicsFile = "topics.json"

type topicRecord struct {
	Name       string            `json:"name"`
	ID         string            `json:"id"`
	Partitions int32             `json:"partitions"`
	Configs    map[string]string `json:"configs,omitempty"`
}

type topicsFileV1 struct {
	Version int           `json:"version"`
	Topics  []topicRecord `json:"topics"`
}

var errTopicExists = errors.New("topic already exists")

// errTopicDeleting: a topic of that name is still being deleted (Kafka:
// "marked for deletion"); asked again, the create succeeds.
var errTopicDeleting = errors.New("a topic of that name is still being deleted")

// validTopicName applies Kafka's rules: 1-249 characters of [a-zA-Z0-9._-],
// not "." or "..".
func validTopicName(name string) error {
	if name == "" {
		return errors.New("topic name is empty")
	}
	if len(name) > 249 {
		return fmt.Errorf("topic name is %d characters, the maximum is 249", len(name))
	}
	if name == "." || name == ".." {
		return fmt.Errorf("topic name %q is not allowed", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q has the illegal character %q (allowed: ASCII letters, digits, '.', '_', '-')", name, c)
		}
	}
	return nil
}

// maxPartitions bounds a topic's partition count (each is a directory
// with open files), asked for or read back.
const maxPartitions = 100000

func partitionDir(dataDir, topic string, p int32) string {
	return filepath.Join(dataDir, topic+"-"+strconv.Itoa(int(p)))
}

func openRegistry(dataDir string, store *log.Store, logger *zap.Logger, tiered bool) (*registry, error) {
	r := &registry{dir: dataDir, store: store, logger: logger, tiered: tiered, topics: map[string]*topic{}, byID: map[[16]byte]*topic{}}
	b, err := os.ReadFile(filepath.Join(dataDir, topicsFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var f topicsFileV1
	if err == nil {
		if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 {
			return nil, fmt.Errorf("broker: %s is unreadable: %v", topicsFile, err)
		}
	}
	for _, rec := range f.Topics {
		// topics.json may have come from the bucket (a restore): each
		// record is checked before anything is opened for it, so a bad one
		// stops the start with a clear error rather than writing outside
		// the data directory, opening one directory twice or without end.
		if err := validTopicName(rec.Name); err != nil {
			return nil, fmt.Errorf("broker: %s: %w", topicsFile, err)
		}
		if rec.Partitions <= 0 || rec.Partitions > maxPartitions {
			return nil, fmt.Errorf("broker: %s: topic %q has %d partitions (1 to %d)", topicsFile, rec.Name, rec.Partitions, maxPartitions)
		}
		t := &topic{name: rec.Name}
		t.setConfigsLocked(rec.Configs)
		idb, err := hex.DecodeString(rec.ID)
		if err != nil || len(idb) != 16 {
			return nil, fmt.Errorf("broker: topic %q has a bad id %q", rec.Name, rec.ID)
		}
		copy(t.id[:], idb)
		if r.topics[t.name] != nil || r.byID[t.id] != nil {
			return nil, fmt.Errorf("broker: %s: topic %q (id %x) is there twice", topicsFile, t.name, t.id)
		}
		t.partitions = make([]*partition, rec.Partitions)
		r.topics[t.name] = t
		r.byID[t.id] = t
	}
	// Every partition of every topic in one batch: opened several at once,
	// and what recovery changed made durable by one syncfs.
	var ts []*topic
	for _, rec := range f.Topics {
		ts = append(ts, r.topics[rec.Name])
	}
	if err := r.openPartitions(ts); err != nil {
		return nil, err
	}
	r.cleanOrphans()
	return r, nil
}

// openPartitions opens every partition of ts (len(t.partitions) slots each,
// filled in) as one batch (log.Store.OpenPartitions), then loads each one's
// producer state.
func (r *registry) openPartitions(ts []*topic) error {
	var dirs []string
	var cfgs []log.Config
	for _, t := range ts {
		cfg := r.logConfig(t.configs)
		for i := range t.partitions {
			dirs = append(dirs, partitionDir(r.dir, t.name, int32(i)))
			cfgs = append(cfgs, cfg)
		}
	}
	lps, err := r.store.OpenPartitions(dirs, cfgs)
	if err != nil {
		return fmt.Errorf("broker: open partitions: %w", err)
	}
	n := 0
	for _, t := range ts {
		for i := range t.partitions {
			p := &partition{topic: t, index: int32(i), log: lps[n], producers: map[int64]*producerState{}}
			n++
			if err := p.loadProducers(); err != nil {
				for _, lp := range lps {
					lp.Close()
				}
				return err
			}
			// Mirrored again after every start: one that failed before a
			// restart (or a crash) is not left stale until the next upload.
			p.mirrorDue.Store(r.tiered)
			t.partitions[i] = p
		}
	}
	return nil
}

func (r *registry) openPartition(t *topic, i int32) (*partition, error) {
	lp, err := r.store.OpenPartition(partitionDir(r.dir, t.name, i), r.logConfig(t.configs))
	if err != nil {
		return nil, fmt.Errorf("broker: open %s-%d: %w", t.name, i, err)
	}
	p := &partition{topic: t, index: i, log: lp, producers: map[int64]*producerState{}}
	if err := p.loadProducers(); err != nil {
		return nil, err
	}
	// Mirrored again after every start: one that failed before a restart
	// (or a crash) is not left stale until the next upload.
	p.mirrorDue.Store(r.tiered)
	return p, nil
}

// cleanOrphans removes partition directories no topic owns: leftovers of a
// deletion interrupted by a crash.
func (r *registry) cleanOrphans() {
	des, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, de := range des {
		if !de.IsDir() {
			continue
		}
		name := de.Name()
		i := strings.LastIndexByte(name, '-')
		if i <= 0 {
			continue
		}
		n, err := strconv.Atoi(name[i+1:])
		if err == nil {
			if t, ok := r.topics[name[:i]]; ok && n >= 0 && n < len(t.partitions) {
				continue
			}
		} else if !strings.HasSuffix(name, "-delete") {
			continue
		}
		r.logger.Warn("removing orphan partition directory", zap.String("dir", name))
		os.RemoveAll(filepath.Join(r.dir, name))
	}
}

// saveLocked writes topics.json atomically. r.mu held.
func (r *registry) saveLocked() error {
	f := topicsFileV1{Version: 1}
	for _, t := range r.topics {
		f.Topics = append(f.Topics, topicRecord{Name: t.name, ID: hex.EncodeToString(t.id[:]), Partitions: int32(len(t.partitions)), Configs: t.configs})
	}
	sort.Slice(f.Topics, func(i, j int) bool { return f.Topics[i].Name < f.Topics[j].Name })
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := log.WriteFileAtomic(log.OSFS, filepath.Join(r.dir, topicsFile), b); err != nil {
		return err
	}
	if r.mirror != nil {
		r.mirror(b)
	}
	return nil
}

func (r *registry) logConfig(set map[string]string) log.Config {
	c := logConfig(set)
	if r.tiered {
		c.RetentionBytes, c.RetentionMs = -1, -1
	}
	return c
}

func (r *registry) get(name string) *topic {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.topics[name]
}

func (r *registry) getByID(id [16]byte) *topic {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byID[id]
}

func (r *registry) all() []*topic {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ts := make([]*topic, 0, len(r.topics))
	for _, t := range r.topics {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
	return ts
}

// partitionsOf returns the topic's current partitions.
func (r *registry) partitionsOf(t *topic) []*partition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return t.partitions
}

func (r *registry) partition(t *topic, i int32) *partition {
	ps := r.partitionsOf(t)
	if i < 0 || int(i) >= len(ps) {
		return nil
	}
	return ps[i]
}

// create makes a topic. validateOnly checks without creating.
func (r *registry) create(name string, partitions int32, configs map[string]string, validateOnly bool) (*topic, error) {
	return r.createTopic(name, nil, partitions, configs, validateOnly)
}

// createWithID creates a topic the cluster already named and numbered
// (cluster.go): its id comes from etcd.
func (r *registry) createWithID(name string, id [16]byte, partitions int32, configs map[string]string) (*topic, error) {
	return r.createTopic(name, &id, partitions, configs, false)
}

// validateTopic checks what create would: the name, the partition count
// and the configs.
func (r *registry) validateTopic(name string, partitions int32, configs map[string]string) error {
	if err := validTopicName(name); err != nil {
		return err
	}
	if internalTopic(name) {
		return errInternalTopic
	}
	if partitions <= 0 {
		return fmt.Errorf("partition count %d must be positive", partitions)
	}
	if partitions > maxPartitions {
		return fmt.Errorf("partition count %d is above the limit %d", partitions, maxPartitions)
	}
	return validateConfigs(configs, r.tiered)
}

func (r *registry) createTopic(name string, id *[16]byte, partitions int32, configs map[string]string, validateOnly bool) (*topic, error) {
	if err := validTopicName(name); err != nil {
		return nil, err
	}
	if internalTopic(name) {
		return nil, errInternalTopic
	}
	if partitions <= 0 {
		return nil, fmt.Errorf("partition count %d must be positive", partitions)
	}
	if partitions > maxPartitions {
		return nil, fmt.Errorf("partition count %d is above the limit %d", partitions, maxPartitions)
	}
	if configs == nil {
		configs = map[string]string{}
	}
	if err := validateConfigs(configs, r.tiered); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.topics[name]; ok {
		return nil, errTopicExists
	}
	if r.deleting[name] {
		return nil, errTopicDeleting
	}
	if validateOnly {
		return &topic{name: name, configs: configs}, nil
	}
	t := &topic{name: name}
	t.setConfigsLocked(configs)
	if id != nil {
		t.id = *id
	} else if _, err := rand.Read(t.id[:]); err != nil {
		return nil, err
	}
	for i := int32(0); i < partitions; i++ {
		os.RemoveAll(partitionDir(r.dir, name, i)) // an orphan must not leak old data into a new topic
	}
	t.partitions = make([]*partition, partitions)
	if err := r.openPartitions([]*topic{t}); err != nil {
		for _, p := range t.partitions {
			if p != nil {
				p.log.Delete()
			}
		}
		return nil, err
	}
	r.topics[name] = t
	r.byID[t.id] = t
	if err := r.saveLocked(); err != nil {
		delete(r.topics, name)
		delete(r.byID, t.id)
		for _, p := range t.partitions {
			p.log.Delete()
		}
		return nil, err
	}
	r.logger.Info("created topic", zap.String("topic", name), zap.Int32("partitions", partitions))
	return t, nil
}

// remove deletes a topic: the registry forgets it first (durably), then its
// partitions are deleted.
func (r *registry) remove(t *topic) error {
	r.mu.Lock()
	if r.topics[t.name] != t {
		r.mu.Unlock()
		return nil
	}
	delete(r.topics, t.name)
	delete(r.byID, t.id)
	if err := r.saveLocked(); err != nil {
		// Still there on disk, so still here: a topic missing only from
		// memory would have the tiering sweep delete its bucket objects.
		// (The write may have failed after its rename, at the directory
		// sync: written again, so the disk has it too, if it can.)
		r.topics[t.name], r.byID[t.id] = t, t
		r.saveLocked()
		r.mu.Unlock()
		return err
	}
	if r.deleting == nil {
		r.deleting = map[string]bool{}
	}
	r.deleting[t.name] = true
	parts := t.partitions
	r.mu.Unlock()
	for _, p := range parts {
		if err := p.log.Delete(); err != nil {
			r.logger.Warn("delete partition", zap.String("topic", t.name), zap.Int32("partition", p.index), zap.Error(err))
		}
	}
	r.mu.Lock()
	delete(r.deleting, t.name)
	r.mu.Unlock()
	r.logger.Info("deleted topic", zap.String("topic", t.name))
	return nil
}

// addPartitions grows a topic to count partitions.
func (r *registry) addPartitions(t *topic, count int32, validateOnly bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := int32(len(t.partitions))
	if count <= cur {
		return fmt.Errorf("topic has %d partitions; the new count %d must be larger", cur, count)
	}
	if count > maxPartitions {
		return fmt.Errorf("partition count %d is above the limit %d", count, maxPartitions)
	}
	if validateOnly {
		return nil
	}
	ps := append([]*partition(nil), t.partitions...)
	undo := func() {
		for _, p := range ps[cur:] {
			p.log.Delete()
		}
	}
	for i := cur; i < count; i++ {
		os.RemoveAll(partitionDir(r.dir, t.name, i))
		p, err := r.openPartition(t, i)
		if err != nil {
			undo()
			return err
		}
		ps = append(ps, p)
	}
	old := t.partitions
	t.partitions = ps
	if err := r.saveLocked(); err != nil {
		// Not in topics.json, so not in the topic: partitions kept only in
		// memory would take writes and commits the next start drops.
		t.partitions = old
		undo()
		return err
	}
	return nil
}

// setConfigs replaces a topic's configs (validated by the caller).
func (r *registry) setConfigs(t *topic, configs map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := t.configs
	t.setConfigsLocked(configs)
	if err := r.saveLocked(); err != nil {
		t.setConfigsLocked(old) // as topics.json still has them
		return err
	}
	lc := r.logConfig(configs)
	for _, p := range t.partitions {
		p.log.SetConfig(lc)
	}
	return nil
}

// configsOf returns a copy of the topic's set configs.
func (r *registry) configsOf(t *topic) map[string]string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m := make(map[string]string, len(t.configs))
	for k, v := range t.configs {
		m[k] = v
	}
	return m
}

func (r *registry) close(workers int) (partitions int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []*partition
	for _, t := range r.topics {
		parts = append(parts, t.partitions...)
	}
	// Each is a few fsyncs (producer state, log, indexes, clean state):
	// one batch shares them (two syncfs calls for all, where there is
	// syncfs; else many closes at once).
	files := map[string][]byte{}
	var mu sync.Mutex
	lps := make([]*log.Partition, len(parts))
	parallel.Each(workers, len(parts), func(i int) {
		lps[i] = parts[i].log
		if path, b, ok := parts[i].producersFile(); ok {
			mu.Lock()
			files[path] = b
			mu.Unlock()
		}
	})
	if err := r.store.CloseBatch(lps, files); err != nil {
		r.logger.Warn("close partitions", zap.Error(err))
	}
	return len(parts)
}
