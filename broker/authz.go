package broker

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Authorization is one call per resource in each handler (allowed), with
// Kafka's error codes in the response; with authorization off (no
// Authorizer) every call allows. It never allocates when it allows.

// clusterName is the one CLUSTER resource's name.
const clusterName = "kafka-cluster"

const (
	opRead            = kmsg.ACLOperationRead
	opWrite           = kmsg.ACLOperationWrite
	opCreate          = kmsg.ACLOperationCreate
	opDelete          = kmsg.ACLOperationDelete
	opAlter           = kmsg.ACLOperationAlter
	opDescribe        = kmsg.ACLOperationDescribe
	opClusterAction   = kmsg.ACLOperationClusterAction
	opDescribeConfigs = kmsg.ACLOperationDescribeConfigs
	opAlterConfigs    = kmsg.ACLOperationAlterConfigs
	opIdempotentWrite = kmsg.ACLOperationIdempotentWrite

	resTopic   = kmsg.ACLResourceTypeTopic
	resGroup   = kmsg.ACLResourceTypeGroup
	resCluster = kmsg.ACLResourceTypeCluster
	resTxnID   = kmsg.ACLResourceTypeTransactionalId
)

// allowed reports whether the connection's principal may do op on the
// resource; a denial goes to the audit log.
func (c *conn) allowed(op kmsg.ACLOperation, rt kmsg.ACLResourceType, name string) bool {
	z := c.s.sec.authz
	if z == nil || z.Authorize(c.principal, c.ip, op, rt, name) {
		return true
	}
	c.s.sec.denied.Add(1)
	c.s.sec.audit.Info("denied", zap.String("event", "acl_denied"), zap.String("principal", c.principal),
		zap.String("client", c.ip), zap.Stringer("operation", op), zap.Stringer("resource_type", rt), zap.String("resource", name))
	return false
}

// allowedCluster is allowed on the CLUSTER resource.
func (c *conn) allowedCluster(op kmsg.ACLOperation) bool {
	return c.allowed(op, resCluster, clusterName)
}

// mayCreateTopic: CREATE on the cluster or on the topic (Kafka checks both).
func (c *conn) mayCreateTopic(name string) bool {
	z := c.s.sec.authz
	if z == nil || z.Authorize(c.principal, c.ip, opCreate, resCluster, clusterName) {
		return true
	}
	return c.allowed(opCreate, resTopic, name)
}

// mayWriteIdempotently is what InitProducerId asks of a producer without a
// transactional id: IDEMPOTENT_WRITE on the cluster, or (KIP-679, Kafka
// 3.0+) WRITE on some topic. The second is looked for among the ALLOW ACLs
// of the principal (or User:*): one that WRITE on its own resource name
// passes.
func (c *conn) mayWriteIdempotently() bool {
	z := c.s.sec.authz
	if z == nil || z.Authorize(c.principal, c.ip, opIdempotentWrite, resCluster, clusterName) {
		return true
	}
	for _, p := range []string{c.principal, "User:*"} {
		f := aclFilterAny()
		f.ResourceType, f.Principal, f.Permission = resTopic, &p, kmsg.ACLPermissionTypeAllow
		for _, a := range z.ACLs().Describe(f) {
			if (a.Operation == opWrite || a.Operation == kmsg.ACLOperationAll) && z.Authorize(c.principal, c.ip, opWrite, resTopic, a.ResourceName) {
				return true
			}
		}
	}
	return c.allowedCluster(opIdempotentWrite) // logs the denial
}

// configsDenied checks op (DESCRIBE_CONFIGS, ALTER_CONFIGS) on a config
// resource: a topic, or a broker (the cluster resource, as in Kafka). It
// returns the error code to answer, 0 if allowed.
func (c *conn) configsDenied(rt kmsg.ConfigResourceType, name string, op kmsg.ACLOperation) int16 {
	switch rt {
	case kmsg.ConfigResourceTypeTopic:
		if !c.allowed(op, resTopic, name) {
			return kerr.TopicAuthorizationFailed.Code
		}
	default:
		if !c.allowedCluster(op) {
			return kerr.ClusterAuthorizationFailed.Code
		}
	}
	return 0
}
