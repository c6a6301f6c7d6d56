package auth

import (
	"crypto/hmac"
	"crypto/subtle"
	"encoding/base64"
	"strings"

	"github.com/xdg-go/scram"
)

// librdkafka before 2.6.1 (confluentinc/librdkafka#4895; kcat and Debian's
// confluent-kafka builds carry 2.0.2) sends its client nonce twice in the
// client-final message: r = client nonce + the server-first nonce (which
// already starts with the client nonce), and computes its proof over the
// message as sent. Kafka 3.8.1 to 3.9 accepted that (a suffix check);
// xdg-go/scram wants the nonce exactly. scramCompatFinal verifies such a
// message as those Kafka versions did: only that exact form, the fresh
// server nonce still in it (no replay), the proof checked over the message
// as received. Every other client-final message goes through xdg-go/scram
// alone.

// scramTranscript is what the compatibility check needs from the first
// round: the client-first message and the server-first reply.
type scramTranscript struct {
	hash        scram.HashGeneratorFcn
	clientFirst string
	serverFirst string
	cred        func(user string) scram.StoredCredentials
}

// scramCompatFinal returns the server-final message if final is an old
// librdkafka client-final with a valid proof; ok false otherwise.
func (t *scramTranscript) compatFinal(user, final string) (reply string, ok bool) {
	gs2, bare, ok := splitGS2(t.clientFirst)
	if !ok {
		return "", false
	}
	clientNonce, ok := fieldValue(bare, "r")
	if !ok {
		return "", false
	}
	fullNonce, ok := fieldValue(t.serverFirst, "r")
	if !ok || !strings.HasPrefix(fullNonce, clientNonce) || len(fullNonce) == len(clientNonce) {
		return "", false
	}
	withoutProof, proofField, ok := strings.Cut(final, ",p=")
	if !ok || strings.Contains(proofField, ",") {
		return "", false
	}
	fields := strings.Split(withoutProof, ",")
	if len(fields) != 2 || fields[0] != "c="+base64.StdEncoding.EncodeToString([]byte(gs2)) || fields[1] != "r="+clientNonce+fullNonce {
		return "", false
	}
	proof, err := base64.StdEncoding.DecodeString(proofField)
	if err != nil {
		return "", false
	}
	cred := t.cred(user)
	authMessage := bare + "," + t.serverFirst + "," + withoutProof
	mac := hmac.New(t.hash, cred.StoredKey)
	mac.Write([]byte(authMessage))
	sig := mac.Sum(nil)
	if len(proof) != len(sig) {
		return "", false
	}
	clientKey := make([]byte, len(sig))
	for i := range sig {
		clientKey[i] = proof[i] ^ sig[i]
	}
	h := t.hash()
	h.Write(clientKey)
	if subtle.ConstantTimeCompare(h.Sum(nil), cred.StoredKey) != 1 {
		return "", false
	}
	mac = hmac.New(t.hash, cred.ServerKey)
	mac.Write([]byte(authMessage))
	return "v=" + base64.StdEncoding.EncodeToString(mac.Sum(nil)), true
}

// splitGS2 splits a client-first message into its gs2 header ("n,," or
// "n,a=user,") and the bare message after it.
func splitGS2(first string) (gs2, bare string, ok bool) {
	i := strings.IndexByte(first, ',')
	if i < 0 {
		return "", "", false
	}
	j := strings.IndexByte(first[i+1:], ',')
	if j < 0 {
		return "", "", false
	}
	return first[:i+j+2], first[i+j+2:], true
}

// fieldValue is the value of attribute k ("k=value") of a SCRAM message.
func fieldValue(msg, k string) (string, bool) {
	for _, f := range strings.Split(msg, ",") {
		if v, ok := strings.CutPrefix(f, k+"="); ok {
			return v, true
		}
	}
	return "", false
}
