package redlock

// ACLRules are the Redis ACL rules a Client needs, and nothing more:
// EVAL/EVALSHA of its scripts and the commands they call (GET, SET, DEL,
// PEXPIRE, TIME; semaphores need nothing more),
// INFO (run_id and uptime, for the quarantine of restarted masters), PING, and HELLO/AUTH to log in. A master
// that refuses one of them answers an error, which counts as a "no" vote.
//
// For external masters, an ACL user for the operator is, in redis.conf or
// an ACL file (with the password's SHA-256 as #<hex>, or >password):
//
//	user redlock-operator on >PASSWORD ~* resetchannels -@all +set +get +del +pexpire +time +eval +evalsha +info +ping +hello +auth &redlock:released:* +publish +subscribe +unsubscribe +zadd +zrem +zrange +pttl
//
// (NoticeACLRules, from &redlock:released:*, for release notices, and
// LineACLRules, the last four, for waiting lines)
//
// and `user default off` disables the default user. Keys are the
// DistributedLocks' keys, their "<key>:fence" counters and "<key>:line"
// waiting lines, the semaphores' keys (their declarations) and
// "<key>:slot:<i>" keys, and WindowKey
// (redlock:quarantine-window): narrow ~* to the locks' prefix when every
// lock uses one, keeping WindowKey (~redlock:* covers it and the default
// keys). A master that refuses WindowKey still votes, but restarted masters
// are then quarantined by each set's own window only.
const ACLRules = "-@all +set +get +del +pexpire +time +eval +evalsha +info +ping +hello +auth"
