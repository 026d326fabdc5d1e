// Package lockvalue derives the Redis value of each lock grant from a secret
// key, the lock's UID and the grant's ID (random, one per acquisition
// attempt).
//
// The value identifies one acquisition on the masters: whoever knows it can
// extend or release the lock. Deriving it (instead of storing a random value)
// keeps it out of the lock's status and lets any operator replica that holds
// the key, such as a new leader, recompute the value of a lock granted by the
// previous one. Every acquisition attempt draws a new grant ID, so no two
// attempts share a value: the clean-up of a failed attempt can never delete
// the keys of another.
package lockvalue

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
)

// MinKeySize is the smallest accepted key, in bytes.
const MinKeySize = 32

// Deriver computes lock values from a secret key.
type Deriver struct {
	key []byte
}

// New returns a Deriver for key, which must be at least MinKeySize bytes of
// secret random data.
func New(key []byte) (*Deriver, error) {
	if len(key) < MinKeySize {
		return nil, errors.New("lock value key: need at least 32 bytes")
	}
	return &Deriver{key: append([]byte(nil), key...)}, nil
}

// Value returns the value of the grant grantID of the lock with uid.
func (d *Deriver) Value(uid, grantID string) string {
	m := hmac.New(sha256.New, d.key)
	m.Write([]byte(uid))
	m.Write([]byte{0})
	m.Write([]byte(grantID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// NewGrantID returns a fresh random grant ID: 128 bits, URL-safe.
func NewGrantID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// SecretKey is the data key of the Secret that holds the derivation key.
const SecretKey = "key"
