package v1alpha1

// RedisCredentialsLabel is the label that, with the value "true", lets a
// Secret be used as the credentials of a RedisMasterSet's masters
// (spec.authSecretRef).
const RedisCredentialsLabel = "redlock.dev/redis-credentials" //nolint:gosec // a label name, not a credential

// Names by which pods take part in locks.
const (
	// LockLabel on a pod requests the DistributedLock of that name in the
	// pod's namespace.
	LockLabel = "redlock.dev/lock"
	// GateModeLabel on a pod chooses its gate when the webhook adds it:
	// "readiness" asks for the readiness gate instead of the scheduling gate;
	// "label" asks for no gate at all: the pod runs and is Ready on its own
	// health, and the holder is marked with HoldsLabel.
	GateModeLabel = "redlock.dev/gate"
	// GateModeReadiness is the value of GateModeLabel that asks for the
	// readiness gate.
	GateModeReadiness = "readiness"
	// GateModeHolderLabel is the value of GateModeLabel that asks for no
	// gate: the holder pod is marked with HoldsLabel instead.
	GateModeHolderLabel = "label"
	// HoldsLabel, with the lock's name as its value, marks the pod that
	// holds that lock, for a Service to select the active pod. The pod gate
	// controller sets it once the grant is committed and removes it when
	// the pod no longer holds the lock; the lock controller grants nobody
	// else while another pod still carries it, so that a Service selecting
	// it never has two ready endpoints.
	HoldsLabel = "redlock.dev/holds"
	// SchedulingGate is the scheduling gate the operator removes when the
	// pod becomes the holder.
	SchedulingGate = "redlock.dev/lock"
	// ReadinessGate is the pod condition type of the readiness gate the
	// operator keeps True while the pod holds the lock.
	ReadinessGate = "redlock.dev/lock-held"
	// FencingTokenAnnotation carries the holder pod's fencing token, written
	// before the pod is ungated.
	FencingTokenAnnotation = "redlock.dev/fencing-token" //nolint:gosec // an annotation name, not a credential
	// LockKeyAnnotation carries the Redis key of the lock the pod holds.
	LockKeyAnnotation = "redlock.dev/lock-key"
	// LockNameAnnotation carries the name of the DistributedLock that
	// granted the pod its token.
	LockNameAnnotation = "redlock.dev/lock-name"
	// OnLostAnnotation carries the lock's spec.onLost at the time of the
	// grant, so that the policy still applies when the lock object is
	// deleted while the pod holds it.
	OnLostAnnotation = "redlock.dev/on-lost"

	// ProblemAnnotation on a pod labelled for a lock says why the operator
	// refuses it (for example both gates at once): such a pod never holds
	// the lock until its spec is fixed.
	ProblemAnnotation = "redlock.dev/problem"

	// UnresponsiveAnnotation marks a pod that held a lock with
	// spec.heartbeatTimeout and stopped renewing its heartbeat (or whose
	// containers crash-looped) for longer than that: its value is the
	// grant ID it was holding. The operator sets it before it gives the
	// grant up; a marked pod whose app the agent runs keeps everyone
	// waiting until that grant can no longer be acted on, then waits
	// behind every other pod.
	UnresponsiveAnnotation = "redlock.dev/unresponsive"

	// PriorityAnnotation on a pod labelled for a lock or a semaphore sets
	// its queue priority, a 32-bit integer (higher is served first); it
	// overrides the value of the pod's PriorityClass (spec.priority). A
	// running holder is never pre-empted (docs/concepts/queue-order.md).
	PriorityAnnotation = "redlock.dev/priority"

	// WaitTimeoutAnnotation on a pod labelled for a lock or a semaphore
	// sets the longest it may wait (a Go duration, e.g. "10m"), overriding
	// the lock's spec.waitTimeout.
	WaitTimeoutAnnotation = "redlock.dev/wait-timeout"
	// OnWaitTimeoutAnnotation on such a pod overrides the lock's
	// spec.onWaitTimeout: Keep or Fail.
	OnWaitTimeoutAnnotation = "redlock.dev/on-wait-timeout"
	// ConditionLockWaitTimeout is the pod condition, True (reason
	// WaitTimeout), on a pod that waited for a lock or a semaphore's slot
	// longer than its wait limit; False (reason Granted) once a pod that
	// kept waiting is granted. A Job's podFailurePolicy matches it on pods
	// the operator set to Failed (onWaitTimeout: Fail).
	ConditionLockWaitTimeout = "redlock.dev/LockWaitTimeout"
	// ReasonWaitTimeout and ReasonGranted are the reasons of the pod
	// condition redlock.dev/LockWaitTimeout.
	ReasonWaitTimeout = "WaitTimeout"
	ReasonGranted     = "Granted"

	// ConditionHolderNotAllowed is the pod condition, True, on a pod that
	// waits for a lock or a semaphore whose spec.allowedHolders does not
	// allow it: it is never granted (reasons ServiceAccountNotAllowed,
	// NamespaceNotAllowed).
	ConditionHolderNotAllowed = "redlock.dev/HolderNotAllowed"

	// AgentAnnotation on a pod labelled for a lock asks the webhook to add
	// the in-pod agent (cmd/agent): AgentRun or AgentWatch.
	AgentAnnotation = "redlock.dev/agent"
	// AgentRun is the value of AgentAnnotation by which the agent starts
	// the app container's command once the pod holds the lock, and stops
	// it by the grant's fencing deadline.
	AgentRun = "run"
	// AgentWatch is the value of AgentAnnotation by which the agent runs as
	// a native sidecar and only publishes the grant in /redlock/state.
	AgentWatch = "watch"
	// AgentContainerAnnotation names the container the agent starts, when
	// the pod has several.
	AgentContainerAnnotation = "redlock.dev/agent-container"
	// AgentGraceAnnotation is the agent's --grace: the time between SIGTERM
	// and SIGKILL for the app.
	AgentGraceAnnotation = "redlock.dev/agent-grace"
	// AgentSkewAllowanceAnnotation is the agent's --skew-allowance: how far
	// the pod's clock may run behind the operator's.
	AgentSkewAllowanceAnnotation = "redlock.dev/agent-skew-allowance"
	// AgentListenAnnotation is the agent's --listen: a loopback address on
	// which it serves GET /grant.
	AgentListenAnnotation = "redlock.dev/agent-listen"
)
