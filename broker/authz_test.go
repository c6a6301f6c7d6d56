package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// aclWorld is a broker with ACLs on, an admin, and a user "u" that may
// only what each test grants it.
type aclWorld struct {
	ss    *secureServer
	admin *kadm.Client
	user  *kgo.Client
}

func newACLWorld(t *testing.T) *aclWorld {
	t.Helper()
	ss := startSecure(t, Config{Authorize: true}, SASLPlaintext)
	admin := adminClient(t, ss.addrs[SASLPlaintext])
	ctx := ctxT(t)
	if _, err := admin.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "u", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "u-pw"}}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"visible", "hidden"} {
		if _, err := admin.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
	}
	user, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "u", Pass: "u-pw"}.AsSha256Mechanism()),
		kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(user.Close)
	return &aclWorld{ss: ss, admin: admin, user: user}
}

func (w *aclWorld) grant(t *testing.T, b *kadm.ACLBuilder) {
	t.Helper()
	res, err := w.admin.CreateACLs(ctxT(t), b.ResourcePatternType(kadm.ACLPatternLiteral))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

func TestACLsInHandlers(t *testing.T) {
	w := newACLWorld(t)
	ctx := ctxT(t)
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("visible").Operations(kadm.OpDescribe))
	ua := kadm.NewClient(w.user)

	// Metadata of all topics leaves out what u may not describe; by name it
	// is TOPIC_AUTHORIZATION_FAILED.
	md, err := ua.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := md.Topics["hidden"]; ok || md.Topics["visible"].Err != nil {
		t.Fatalf("all-topics metadata as u: %+v", md.Topics)
	}
	if code := metadataCode(t, w.user, "hidden"); code != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("metadata of hidden: code %d", code)
	}
	// DESCRIBE but not CREATE: no auto-creation.
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("nocreate").Operations(kadm.OpDescribe))
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("nocreate")
	req.Topics, req.AllowAutoTopicCreation = append(req.Topics, rt), true
	mresp, err := req.RequestWith(ctx, w.user)
	if err != nil || mresp.Topics[0].ErrorCode != kerr.TopicAuthorizationFailed.Code || w.ss.reg.get("nocreate") != nil {
		t.Fatalf("auto-create without CREATE: %v %+v", err, mresp)
	}

	// CreateTopics, DeleteTopics, CreatePartitions, configs.
	if _, err := ua.CreateTopic(ctx, 1, 1, nil, "mine"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("CreateTopics without CREATE: %v", err)
	}
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("mine").Operations(kadm.OpCreate))
	if _, err := ua.CreateTopic(ctx, 1, 1, nil, "mine"); err != nil {
		t.Fatalf("CreateTopics with CREATE on the topic: %v", err)
	}
	// Created with CREATE alone: the v5+ answer withholds the configs.
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("mine2").Operations(kadm.OpCreate))
	ct := kmsg.NewPtrCreateTopicsRequest()
	ctt := kmsg.NewCreateTopicsRequestTopic()
	ctt.Topic, ctt.NumPartitions, ctt.ReplicationFactor = "mine2", 1, 1
	ct.Topics = append(ct.Topics, ctt)
	ctr, err := ct.RequestWith(ctx, w.user)
	if err != nil || ctr.Topics[0].ErrorCode != 0 || ctr.Topics[0].ConfigErrorCode != kerr.TopicAuthorizationFailed.Code || len(ctr.Topics[0].Configs) != 0 {
		t.Fatalf("CreateTopics with CREATE but not DESCRIBE_CONFIGS: %v %+v", err, ctr)
	}
	if _, err := ua.DeleteTopic(ctx, "visible"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("DeleteTopics without DELETE: %v", err)
	}
	if cp, err := ua.CreatePartitions(ctx, 2, "visible"); err != nil || !errors.Is(cp["visible"].Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("CreatePartitions without ALTER: %v %+v", err, cp)
	}
	if rc, err := ua.DescribeTopicConfigs(ctx, "visible"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("DescribeConfigs without DESCRIBE_CONFIGS: %v %+v", err, rc)
	}
	if bc, err := ua.DescribeBrokerConfigs(ctx); !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("broker DescribeConfigs without DESCRIBE_CONFIGS on the cluster: %v %+v", err, bc)
	}
	dc, err := kmsg.NewPtrDescribeClusterRequest().RequestWith(ctx, w.user)
	if err != nil || dc.ErrorCode != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("DescribeCluster: %v %+v", err, dc)
	}
	if res, err := ua.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow().AllowHosts().Operations()); err != nil || len(res) == 0 || !errors.Is(res[0].Err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("DescribeAcls as u: %v %+v", err, res)
	}
	if _, err := ua.DescribeUserSCRAMs(ctx); !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("DescribeUserScramCredentials as u: %v", err)
	}

	// ListOffsets needs DESCRIBE: granted on visible, not hidden.
	lreq := kmsg.NewPtrListOffsetsRequest()
	for _, topic := range []string{"visible", "hidden"} {
		lt := kmsg.NewListOffsetsRequestTopic()
		lt.Topic = topic
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Timestamp = -1
		lt.Partitions = append(lt.Partitions, lp)
		lreq.Topics = append(lreq.Topics, lt)
	}
	raw, err := w.user.Broker(0).Request(ctx, lreq) // one broker, no per-partition routing
	lresp, _ := raw.(*kmsg.ListOffsetsResponse)
	if err != nil || len(lresp.Topics) != 2 || lresp.Topics[0].Partitions[0].ErrorCode != 0 ||
		lresp.Topics[1].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("ListOffsets visible, hidden: %v %+v", err, lresp)
	}

	// InitProducerId: without WRITE anywhere CLUSTER_AUTHORIZATION_FAILED;
	// WRITE on one topic is enough (KIP-679).
	ip := kmsg.NewPtrInitProducerIDRequest()
	iresp, err := ip.RequestWith(ctx, w.user)
	if err != nil || iresp.ErrorCode != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("InitProducerId without WRITE: %v %+v", err, iresp)
	}
	w.grant(t, kadm.NewACLs().Allow("User:u").Topics("visible").Operations(kadm.OpWrite))
	iresp, err = ip.RequestWith(ctx, w.user)
	if err != nil || iresp.ErrorCode != 0 || iresp.ProducerID < 0 {
		t.Fatalf("InitProducerId with WRITE on a topic: %v %+v", err, iresp)
	}

	// OffsetFetch v8 naming a group twice, once for all topics: only
	// topics u may describe come back.
	{
		cl, err := kgo.NewClient(kgo.SeedBrokers(w.ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "admin", Pass: testAdminPassword}.AsSha512Mechanism()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kadm.NewClient(cl).CommitOffsets(ctx, "g-dup", kadm.OffsetsFromRecords(kgo.Record{Topic: "hidden", Partition: 0, Offset: 41})); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		w.grant(t, kadm.NewACLs().Allow("User:u").Groups("g-dup").Operations(kadm.OpDescribe))
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Version = 8
		all := kmsg.NewOffsetFetchRequestGroup()
		all.Group = "g-dup"
		named := kmsg.NewOffsetFetchRequestGroup()
		named.Group = "g-dup"
		nt := kmsg.NewOffsetFetchRequestGroupTopic()
		nt.Topic, nt.Partitions = "visible", []int32{0}
		named.Topics = append(named.Topics, nt)
		of.Groups = append(of.Groups, all, named)
		raw, err := w.user.Broker(0).Request(ctx, of)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range raw.(*kmsg.OffsetFetchResponse).Groups {
			for _, tp := range g.Topics {
				if tp.Topic == "hidden" {
					t.Fatalf("OffsetFetch v8 answered offsets of a topic u may not describe: %+v", tp)
				}
			}
		}
	}

	// Groups: ListGroups shows only what u may describe.
	for _, g := range []string{"g-mine", "g-other"} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(w.ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "admin", Pass: testAdminPassword}.AsSha512Mechanism()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kadm.NewClient(cl).CommitOffsets(ctx, g, kadm.OffsetsFromRecords(kgo.Record{Topic: "visible", Partition: 0, Offset: 0})); err != nil {
			t.Fatal(err)
		}
		cl.Close()
	}
	w.grant(t, kadm.NewACLs().Allow("User:u").Groups("g-mine").Operations(kadm.OpDescribe))
	lg, err := ua.ListGroups(ctx)
	if _, other := lg["g-other"]; err != nil || len(lg) != 2 || lg["g-mine"].Group != "g-mine" || other {
		t.Fatalf("ListGroups as u: %v %+v", err, lg)
	}
	of, err := ua.FetchOffsets(ctx, "g-other")
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("OffsetFetch of another group: %v %+v", err, of)
	}
	of, err = ua.FetchOffsets(ctx, "g-mine")
	if o, _ := of.Lookup("visible", 0); err != nil || o.Err != nil {
		t.Fatalf("OffsetFetch of g-mine: %v", err)
	}
	if cr, err := ua.CommitOffsets(ctx, "g-mine", kadm.OffsetsFromRecords(kgo.Record{Topic: "visible", Partition: 0, Offset: 0})); err != nil || !errors.Is(cr.Error(), kerr.GroupAuthorizationFailed) {
		t.Fatalf("OffsetCommit without READ on the group: %v %v", err, cr.Error())
	}
	if dg, err := ua.DeleteGroups(ctx, "g-mine"); err != nil || !errors.Is(dg["g-mine"].Err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("DeleteGroups without DELETE: %v %+v", err, dg)
	}

	// DENY wins over ALLOW.
	res, err := w.admin.CreateACLs(ctx, kadm.NewACLs().Deny("User:u").DenyHosts("*").Topics("visible").Operations(kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral))
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	if code := metadataCode(t, w.user, "visible"); code != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("metadata of visible after a DENY: code %d", code)
	}
}

func TestACLAndSCRAMAdminErrors(t *testing.T) {
	w := newACLWorld(t)
	ctx := ctxT(t)
	// SCRAM alterations: each user's own error code.
	req := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
	up := func(name string, mech int8, iters int32, salted int) {
		u := kmsg.NewAlterUserSCRAMCredentialsRequestUpsertion()
		u.Name, u.Mechanism, u.Iterations, u.Salt, u.SaltedPassword = name, mech, iters, []byte("salt"), make([]byte, salted)
		req.Upsertions = append(req.Upsertions, u)
	}
	up("few-iterations", 1, 1000, 32)
	up("bad-mech", 7, 4096, 32)
	up("short-key", 1, 4096, 3)
	up("twice", 2, 4096, 64)
	up("twice", 2, 4096, 64)
	up("fine", 2, 4096, 64)
	d := kmsg.NewAlterUserSCRAMCredentialsRequestDeletion()
	d.Name, d.Mechanism = "nobody", 1
	req.Deletions = append(req.Deletions, d)
	resp, err := req.RequestWith(ctx, w.ss.adminKgo(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int16{
		"few-iterations": kerr.UnacceptableCredential.Code, "bad-mech": kerr.UnsupportedSaslMechanism.Code,
		"short-key": kerr.UnacceptableCredential.Code, "twice": kerr.DuplicateResource.Code, "fine": 0,
		"nobody": kerr.ResourceNotFound.Code,
	}
	for _, r := range resp.Results {
		if want[r.User] != r.ErrorCode {
			t.Errorf("AlterUserScramCredentials %s: code %d, want %d", r.User, r.ErrorCode, want[r.User])
		}
		delete(want, r.User)
	}
	if len(want) != 0 {
		t.Errorf("no result for %v", want)
	}
	ds, err := w.admin.DescribeUserSCRAMs(ctx, "fine", "absent")
	if err != nil || ds["fine"].Err != nil || len(ds["fine"].CredInfos) != 1 || !errors.Is(ds["absent"].Err, kerr.ResourceNotFound) {
		t.Fatalf("DescribeUserScramCredentials: %v %+v", err, ds)
	}
	// ACLs: an invalid entry is INVALID_REQUEST and the rest are created.
	cr := kmsg.NewPtrCreateACLsRequest()
	for _, p := range []string{"User:ok", "no-colon"} {
		c := kmsg.NewCreateACLsRequestCreation()
		c.ResourceType, c.ResourceName, c.ResourcePatternType = kmsg.ACLResourceTypeTopic, "t", kmsg.ACLResourcePatternTypeLiteral
		c.Principal, c.Host, c.Operation, c.PermissionType = p, "*", kmsg.ACLOperationRead, kmsg.ACLPermissionTypeAllow
		cr.Creations = append(cr.Creations, c)
	}
	cresp, err := cr.RequestWith(ctx, w.ss.adminKgo(t))
	if err != nil || cresp.Results[0].ErrorCode != 0 || cresp.Results[1].ErrorCode != kerr.InvalidRequest.Code {
		t.Fatalf("CreateAcls: %v %+v", err, cresp)
	}
	dr := kmsg.NewPtrDescribeACLsRequest()
	dr.ResourceType, dr.ResourcePatternType = kmsg.ACLResourceTypeAny, kmsg.ACLResourcePatternTypeMatch
	dr.ResourceName = kmsg.StringPtr("t")
	dr.Operation, dr.PermissionType = kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
	dresp, err := dr.RequestWith(ctx, w.ss.adminKgo(t))
	if err != nil || dresp.ErrorCode != 0 || len(dresp.Resources) != 1 || len(dresp.Resources[0].ACLs) != 1 {
		t.Fatalf("DescribeAcls MATCH t: %v %+v", err, dresp)
	}
	dr.ResourceType = kmsg.ACLResourceTypeUnknown
	if dresp, err = dr.RequestWith(ctx, w.ss.adminKgo(t)); err != nil || dresp.ErrorCode != kerr.InvalidRequest.Code {
		t.Fatalf("DescribeAcls with an UNKNOWN type: %v %+v", err, dresp)
	}
}

// Without --authorizer acl the ACL APIs answer SECURITY_DISABLED and every
// authenticated principal may do anything.
func TestNoAuthorizer(t *testing.T) {
	ss := startSecure(t, Config{}, SASLPlaintext)
	adm := adminClient(t, ss.addrs[SASLPlaintext])
	res, err := adm.DescribeACLs(ctxT(t), kadm.NewACLs().AnyResource().Allow().AllowHosts().Operations())
	if err != nil || len(res) == 0 || !errors.Is(res[0].Err, kerr.SecurityDisabled) {
		t.Fatalf("DescribeAcls without an authorizer: %v %+v", err, res)
	}
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, "free"); err != nil {
		t.Fatal(err)
	}
}

func (ss *secureServer) adminKgo(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(ss.addrs[SASLPlaintext]), kgo.SASL(scram.Auth{User: "admin", Pass: testAdminPassword}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// metadataCode is the error code Metadata answers for topic.
func metadataCode(t *testing.T, cl *kgo.Client, topic string) int16 {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctxT(t), cl)
	if err != nil || len(resp.Topics) != 1 {
		t.Fatalf("Metadata %s: %v %+v", topic, err, resp)
	}
	return resp.Topics[0].ErrorCode
}
