// Package lockvalue derives the Redis value of each lock grant from a secret
// key, the lock's UID and the grant's fencing token.
//
// The value identifies one acquisition on the masters: whoever knows it can
// extend or release the lock. Deriving it (instead of storing a random value)
// keeps it out of the lock's status and lets any operator replica that holds
// the key, such as a new leader, recompute the value of a lock granted by the
// previous one. Fencing tokens never repeat for a lock, so neither do values.
package lockvalue

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
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

// Value returns the value of grant token of the lock with uid.
func (d *Deriver) Value(uid string, token int64) string {
	m := hmac.New(sha256.New, d.key)
	m.Write([]byte(uid))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatInt(token, 10)))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// SecretKey is the data key of the Secret that holds the derivation key.
const SecretKey = "key"
