package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a RedisMasterSet.
const (
	// ConditionAvailable is True when a quorum of masters is reachable and
	// not quarantined.
	ConditionAvailable = "Available"
	// ConditionDegraded is True when some master is down or quarantined.
	ConditionDegraded = "Degraded"
	// ConditionOwnWindow is False when another set sharing the masters (in
	// another namespace or cluster) registered a longer quarantine window
	// on them than this set's own: the operator quarantines restarted
	// masters by the longer window (status.quarantineWindow), never by its
	// own, and says so here.
	ConditionOwnWindow = "OwnQuarantineWindow"
	// ConditionMembershipChanging is True while the list of masters
	// changes (status.membershipChange): every grant and renewal needs a
	// quorum of the previous list and of the new one until the change
	// ends. A further edit of the list waits for it (reason
	// ChangeQueued).
	ConditionMembershipChanging = "MembershipChanging"
	// ConditionSurvivesZoneLoss (managed sets) is True when losing any one
	// zone leaves a quorum of the members running (a member not running
	// counts as lost); False (reason QuorumInOneZone) when losing one
	// would not; Unknown (ZonesUnknown) when members' zones are not known
	// and could decide it.
	ConditionSurvivesZoneLoss = "SurvivesZoneLoss"
)

// Reasons used in RedisMasterSet conditions.
const (
	ReasonQuorumServing   = "QuorumServing"
	ReasonQuorumLost      = "QuorumLost"
	ReasonAllServing      = "AllServing"
	ReasonMembersDown     = "MembersDown"
	ReasonAuthSecretError = "AuthSecretError"
	// ReasonAuthSecretNotOptedIn: the auth Secret lacks the label
	// RedisCredentialsLabel: "true", so the operator does not use it.
	ReasonAuthSecretNotOptedIn = "AuthSecretNotOptedIn"
	// ReasonTLSSecretError: a Secret of spec.tls is missing, not opted in,
	// or its certificate does not parse, does not match its key, does not
	// chain to the CA or has expired. Nothing is sent to the masters and,
	// for managed sets, nothing is rolled out.
	ReasonTLSSecretError   = "TLSSecretError"
	ReasonNoMembers        = "NoMembers"
	ReasonProbeNotYetRun   = "ProbeNotYetRun"
	ReasonUnsupportedSpec  = "UnsupportedSpec"
	ReasonMembersAvailable = "MembersAvailable"
	// ReasonWindowOwn: no set sharing the masters registered a longer
	// quarantine window than this set's own.
	ReasonWindowOwn = "OwnWindowIsLongest"
	// ReasonWindowShared: a set sharing the masters registered a longer
	// quarantine window, which this set's clients use.
	ReasonWindowShared = "LongerWindowShared"
	// ReasonWindowNotRegistered: a master refused the window registration
	// (an ACL without EVAL or without access to the key
	// redlock:quarantine-window): restarted masters are quarantined by the
	// set's own window only, whatever sets sharing them registered.
	ReasonWindowNotRegistered = "WindowNotRegistered"
	// ReasonJointQuorums: a membership change is under way.
	ReasonJointQuorums = "JointQuorums"
	// ReasonChangeQueued: the spec names yet another list while a change
	// is under way; it starts when the current one ends.
	ReasonChangeQueued = "ChangeQueued"
	// ReasonMembershipStable: no change under way; locks are granted on
	// status.addresses.
	ReasonMembershipStable = "MembershipStable"
	// ReasonNoZoneHoldsQuorum: no zone holds a quorum of the members.
	ReasonNoZoneHoldsQuorum = "NoZoneHoldsQuorum"
	// ReasonQuorumInOneZone: losing one zone would leave fewer than a
	// quorum of the members running, and stop every lock of the set.
	ReasonQuorumInOneZone = "QuorumInOneZone"
	// ReasonZonesUnknown: some members' zones are not known (pods not
	// scheduled, nodes without the zone label, or Nodes not read).
	ReasonZonesUnknown = "ZonesUnknown"
)

// Member states.
const (
	MemberServing     = "Serving"
	MemberQuarantined = "Quarantined"
	MemberStarting    = "Starting"
	MemberDown        = "Down"
)

// ExternalMasters lists masters run outside the operator.
type ExternalMasters struct {
	// Addresses of the independent masters, "host:port" or "[ipv6]:port".
	// An even number of masters tolerates no more failures than one fewer:
	// prefer an odd number.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=15
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	Addresses []string `json:"addresses"`
}

// Persistence modes of managed masters.
const (
	PersistenceNone        = "None"
	PersistenceAOFEverySec = "AOFEverySec"
	PersistenceAOFAlways   = "AOFAlways"
)

// Spread policies of managed masters across nodes (spread), and across
// zones (zoneSpread, which also has SpreadNone).
const (
	SpreadPreferred = "Preferred"
	SpreadStrict    = "Strict"
	SpreadNone      = "None"
)

// ManagedMasters describes masters the operator runs as a StatefulSet of
// independent redis-server instances (no replication).
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.persistence) || (has(self.persistence) && self.persistence == oldSelf.persistence)",message="persistence is immutable: its volumes are fixed when the set is created"
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage) && (!has(self.storage) || self.storage == oldSelf.storage)",message="storage is immutable: its volumes are fixed when the set is created"
// +kubebuilder:validation:XValidation:rule="!has(self.zoneSpread) || self.zoneSpread != 'Strict' || !has(self.replicas) || self.replicas >= 3",message="zoneSpread Strict needs at least 3 replicas: one member is a quorum, and its zone always holds it"
// +kubebuilder:validation:XValidation:rule="!has(self.exposedAddresses) || size(self.exposedAddresses) == (has(self.replicas) ? self.replicas : 5)",message="exposedAddresses names every member: one address per replica"
type ManagedMasters struct {
	// Replicas is the number of masters this cluster runs, 1 to 15. With
	// no external members it must be odd; with external members (run by
	// other clusters' operators, or by hand) the set's total must be. It
	// may grow, not shrink: the new members join through a membership
	// change with joint quorums (status.membershipChange), so that locks
	// stay held.
	// +optional
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=15
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="replicas may grow, not shrink: to run fewer masters, create a new RedisMasterSet and move the locks"
	Replicas int32 `json:"replicas,omitempty"`

	// ExposedAddresses are the members' addresses as sets in other
	// clusters name them ("host:port"), member i at index i: one per
	// replica, so grow both together. The serving certificates the
	// operator issues name their hosts, and a certificate of
	// tls.serverSecretRef must. Reaching the members there is the
	// cluster's to arrange: a LoadBalancer Service per member, or
	// hostNetwork, whose members then listen on every address of their
	// node instead of loopback only (docs/tasks/cross-cluster.md).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=15
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	ExposedAddresses []string `json:"exposedAddresses,omitempty"`

	// Image of redis-server (Redis 7).
	// +optional
	// +kubebuilder:default="redis:7.2"
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image,omitempty"`

	// Port Redis listens on. With hostNetwork, member i listens on port+i.
	// +optional
	// +kubebuilder:default=6379
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// Persistence: None (a restart loses every key: the member waits out
	// restartDelay), AOFEverySec, or AOFAlways (every write fsynced: no
	// wait). AOF modes keep the data on a PersistentVolumeClaim.
	// +optional
	// +kubebuilder:default=None
	// +kubebuilder:validation:Enum=None;AOFEverySec;AOFAlways
	Persistence string `json:"persistence,omitempty"`

	// Storage of the AOF modes.
	// +optional
	Storage *StorageSpec `json:"storage,omitempty"`

	// RestartDelay is how long a member that may have lost its keys stays
	// out of service. Defaults to maxLockTTL + 1% + 2ms + 1s; must exceed
	// maxLockTTL unless persistence is AOFAlways.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	RestartDelay *metav1.Duration `json:"restartDelay,omitempty"`

	// Spread of the members across nodes by hostname: Preferred (default)
	// or Strict (a member stays Pending rather than share a node).
	// +optional
	// +kubebuilder:default=Preferred
	// +kubebuilder:validation:Enum=Preferred;Strict
	Spread string `json:"spread,omitempty"`

	// ZoneSpread of the members across zones (their nodes' label
	// topology.kubernetes.io/zone). Preferred (default): spread where the
	// scheduler can. Strict: no zone holds a quorum (replicas/2+1
	// members); a member that would make one stays Pending, and so do
	// members on nodes without the label. Strict needs at least 3
	// replicas, and 3 zones to run them all. None: no zone rule. A set
	// first run by an earlier version takes Preferred when its members
	// next roll for another reason (a new password or gate image).
	// +optional
	// +kubebuilder:default=Preferred
	// +kubebuilder:validation:Enum=None;Preferred;Strict
	ZoneSpread string `json:"zoneSpread,omitempty"`

	// HostNetwork runs the members in the host's network namespace, member
	// i on port+i: for clusters without a pod network. Pod Security levels
	// baseline and restricted refuse host-network pods.
	// +optional
	HostNetwork bool `json:"hostNetwork,omitempty"`

	// Resources of the Redis container. Requests default to 50m CPU and
	// 64Mi memory, so that members are not BestEffort (the first pods
	// evicted under node pressure).
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// PodSecurityContext replaces the members' pod security context. The
	// default meets Pod Security "restricted": non-root UID and GID 999
	// (fsGroup 999, so the data and ACL volumes are readable), seccomp
	// RuntimeDefault.
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	// ContainerSecurityContext replaces the security context of the
	// members' containers (the gate installer and Redis). The default meets
	// Pod Security "restricted": no privilege escalation, every capability
	// dropped, a read-only root filesystem (data and state are volumes).
	// +optional
	ContainerSecurityContext *corev1.SecurityContext `json:"containerSecurityContext,omitempty"`
	// AllowedClients are further peers the members' NetworkPolicy admits on
	// the Redis port, besides the operator's own pods (for example a
	// monitoring agent). The policy binds only where the cluster's network
	// plugin enforces NetworkPolicies, and never host-network members.
	// +optional
	// +listType=atomic
	AllowedClients []networkingv1.NetworkPolicyPeer `json:"allowedClients,omitempty"`
	// GateImage is the image the members' init container copies the gate
	// binary from (the operator's image of some version). Empty keeps the
	// one recorded in status.gateImage: the operator's image when the set
	// was first run. Set it to roll the members onto a newer gate, one at
	// a time.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	GateImage string `json:"gateImage,omitempty"`
	// ImagePullSecrets are Secrets in the set's namespace for pulling the
	// Redis image and the gate image from a private registry. A change
	// rolls the members one at a time, as any change of their template.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// PriorityClassName of the members: a lock service outranks the
	// workloads that wait on it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// NodeSelector of the members.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the members.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity of the members.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
}

// StorageSpec sizes the PersistentVolumeClaim of each member.
type StorageSpec struct {
	// Size of each member's volume.
	// +kubebuilder:default="1Gi"
	Size resource.Quantity `json:"size"`
	// StorageClassName of the claims; empty uses the cluster's default.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// SecretKeyRef names a key of a Secret in the master set's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key of the password in the Secret. Defaults to "password".
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
	// UsernameKey is the key of an ACL user name in the Secret; empty uses
	// the default user.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	UsernameKey string `json:"usernameKey,omitempty"`
}

// LocalSecretRef names a Secret in the master set's namespace.
type LocalSecretRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// CABundleRef names a PEM bundle of CA certificates in a Secret of the
// master set's namespace.
type CABundleRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key of the bundle in the Secret. Defaults to "ca.crt".
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// MasterTLS configures TLS between the operator and a set's masters. Every
// Secret it names must carry the label redlock.dev/redis-credentials:
// "true", as authSecretRef does.
type MasterTLS struct {
	// ServerSecretRef (managed sets) names a Secret holding tls.crt and
	// tls.key — with ca.crt, the shape a cert-manager Certificate writes —
	// that the members serve. Empty: the operator issues a CA (Secret
	// <set>-tls-ca) and serving certificates (Secrets <set>-tls-<hash>) and
	// renews them before they expire. A new certificate rolls the members
	// one at a time, each through its restart delay.
	// +optional
	ServerSecretRef *LocalSecretRef `json:"serverSecretRef,omitempty"`
	// CASecretRef names the PEM bundle of CAs the operator verifies the
	// masters' certificates with (external sets, and managed sets with
	// serverSecretRef). Defaults: the ca.crt of serverSecretRef; for
	// external sets, the system's roots.
	// +optional
	CASecretRef *CABundleRef `json:"caSecretRef,omitempty"`
	// ClientSecretRef names a Secret holding tls.crt and tls.key: the client
	// certificate the operator presents to masters that require one
	// (tls-auth-clients yes).
	// +optional
	ClientSecretRef *LocalSecretRef `json:"clientSecretRef,omitempty"`
	// ServerName (sets without managed members) is the name verified in every master's
	// certificate; empty verifies each address's own host name or IP.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServerName string `json:"serverName,omitempty"`
	// CertificateDuration is the lifetime of the serving certificates the
	// operator issues: 2160h (90 days) by default, at least 1h. One is
	// renewed when two thirds of it have passed, or earlier, so that the
	// members can roll onto its successor twice over before it expires.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1h') && duration(self) <= duration('87600h')",message="certificateDuration must be between 1h and 87600h"
	CertificateDuration *metav1.Duration `json:"certificateDuration,omitempty"`
}

// RedisMasterSetSpec is the desired state of a RedisMasterSet: external
// masters (run elsewhere, monitored), managed ones (run by the operator),
// or both — a set whose members different clusters' operators run, each
// naming the others' as external. The list of masters is the managed
// members, then the external addresses.
//
// +kubebuilder:validation:XValidation:rule="has(self.external) || has(self.managed)",message="set external, managed, or both"
// +kubebuilder:validation:XValidation:rule="!has(self.managed) || ((has(self.managed.replicas) ? self.managed.replicas : 5) + (has(self.external) ? size(self.external.addresses) : 0)) % 2 == 1",message="a set with managed members must have an odd number of masters: managed.replicas plus the external addresses"
// +kubebuilder:validation:XValidation:rule="!has(self.managed) || !has(self.managed.restartDelay) || self.managed.persistence == 'AOFAlways' || duration(self.managed.restartDelay) > duration(self.maxLockTTL)",message="managed.restartDelay must exceed maxLockTTL unless persistence is AOFAlways"
// +kubebuilder:validation:XValidation:rule="!has(self.external) || !has(self.managed) || !has(self.managed.exposedAddresses) || self.external.addresses.all(a, !(a in self.managed.exposedAddresses))",message="an external address is one of this set's own managed members (managed.exposedAddresses): it would vote twice"
// +kubebuilder:validation:XValidation:rule="has(self.managed) == has(oldSelf.managed)",message="managed members cannot be added to or removed from a set: create a new RedisMasterSet and move the locks"
// +kubebuilder:validation:XValidation:rule="!has(self.nodeTimeout) || duration(self.nodeTimeout).getMilliseconds() * 10 <= duration(self.maxLockTTL).getMilliseconds()",message="nodeTimeout must be at most a tenth of maxLockTTL"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.tls.serverSecretRef) || has(self.managed)",message="tls.serverSecretRef applies to managed sets only"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.tls.certificateDuration) || (has(self.managed) && !has(self.tls.serverSecretRef))",message="tls.certificateDuration applies to the certificates the operator issues: managed sets without tls.serverSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.tls.caSecretRef) || !has(self.managed) || has(self.tls.serverSecretRef)",message="tls.caSecretRef applies to external sets and to managed sets with tls.serverSecretRef: the operator trusts its own CA for the certificates it issues"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.tls.serverName) || !has(self.managed)",message="tls.serverName applies to sets without managed members"
// +kubebuilder:validation:XValidation:rule="!has(self.managed) || !has(self.external) || has(self.authSecretRef)",message="a set with both managed and external members needs authSecretRef: the password every cluster's members share (a generated one is this cluster's alone)"
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.managed) || !has(self.external) || has(self.tls.serverSecretRef)",message="a set with both managed and external members needs tls.serverSecretRef over TLS: a certificate from a CA the clusters share (the CA the operator issues is its own cluster's alone)"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.managed) || has(self.tls) == has(oldSelf.tls)",message="tls cannot be turned on or off on a managed set (members with and without it cannot vote together): create a new RedisMasterSet and move the locks"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.managed) || !has(self.tls) || !has(oldSelf.tls) || (has(self.tls.serverSecretRef) == has(oldSelf.tls.serverSecretRef) && (!has(self.tls.serverSecretRef) || self.tls.serverSecretRef == oldSelf.tls.serverSecretRef))",message="tls.serverSecretRef of a managed set is immutable (members serving certificates of two CAs cannot all be trusted during the roll): renew the certificate in the same Secret"
type RedisMasterSetSpec struct {
	// External lists masters this cluster's operator does not run: run by
	// hand, or another cluster's managed members (their exposedAddresses).
	// +optional
	External *ExternalMasters `json:"external,omitempty"`

	// Managed masters run by this cluster's operator as a StatefulSet.
	// +optional
	Managed *ManagedMasters `json:"managed,omitempty"`

	// MaxLockTTL is the longest TTL a lock on these masters may use. A master
	// that restarted less than maxLockTTL (plus drift and a margin) ago does
	// not vote, so locks it forgot cannot be granted twice.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="maxLockTTL must be between 1s and 24h"
	MaxLockTTL metav1.Duration `json:"maxLockTTL"`

	// AuthSecretRef names the Secret holding the masters' password. The
	// Secret must carry the label redlock.dev/redis-credentials: "true":
	// the operator sends no other Secret to any master (someone allowed to
	// create a RedisMasterSet but not to read Secrets could otherwise have
	// any Secret of the namespace sent to an address of their choosing).
	// For managed masters a labelled Secret is generated when none is given.
	// +optional
	AuthSecretRef *SecretKeyRef `json:"authSecretRef,omitempty"`

	// NodeTimeout bounds each request to one master. Defaults to ttl/100
	// clamped to 50ms–200ms per lock.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('10s')",message="nodeTimeout must be between 1ms and 10s"
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`

	// TLS encrypts and authenticates the connections to the masters;
	// managed members then listen for TLS only. It cannot be turned on or
	// off on an existing managed set.
	// +optional
	TLS *MasterTLS `json:"tls,omitempty"`
}

// MemberStatus is the observed state of one master.
type MemberStatus struct {
	// Address of the master.
	Address string `json:"address"`
	// State: Serving, Quarantined, Starting or Down.
	State string `json:"state"`
	// Reachable is true when the last probe got an answer.
	Reachable bool `json:"reachable"`
	// RunID is the master's run_id from its last answer.
	// +optional
	RunID string `json:"runID,omitempty"`
	// Restarts counts run_id changes seen by the operator.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// QuarantinedUntil is when a restarted master votes again.
	// +optional
	QuarantinedUntil *metav1.Time `json:"quarantinedUntil,omitempty"`
	// LastServingAt is when the member was last seen serving, on the clock
	// of the operator process that saw it (managed masters: the admission
	// of a replacement pod is computed from it only by that same process;
	// another waits a full restart delay).
	// +optional
	LastServingAt *metav1.Time `json:"lastServingAt,omitempty"`
	// NeverServed marks a member of a new managed set that has not served
	// yet: its first pod is admitted at once. Without it and without
	// lastServingAt, nothing is known of the member and a new pod waits a
	// full restart delay.
	// +optional
	NeverServed bool `json:"neverServed,omitempty"`
	// Message explains a Down state.
	// +optional
	Message string `json:"message,omitempty"`
	// Zone of the node a managed member's pod runs on (its label
	// topology.kubernetes.io/zone). Empty when not known: an external
	// member, a pod not scheduled, a node without the label, or an
	// operator that does not read Nodes (--watch-nodes=false, the default
	// with --watch-namespaces).
	// +optional
	Zone string `json:"zone,omitempty"`
}

// Member is the status of the master at addr (nil: none recorded).
func (s *RedisMasterSetStatus) Member(addr string) *MemberStatus {
	for i := range s.Members {
		if s.Members[i].Address == addr {
			return &s.Members[i]
		}
	}
	return nil
}

// MasterTLSStatus describes the certificate a managed set's members serve.
type MasterTLSStatus struct {
	// SecretName is the Secret the members serve: serverSecretRef, or the
	// one the operator issued last.
	SecretName string `json:"secretName"`
	// NotAfter is when its certificate expires.
	// +optional
	NotAfter *metav1.Time `json:"notAfter,omitempty"`
	// RenewAt is when the operator issues the next certificate (the
	// certificates it issues only).
	// +optional
	RenewAt *metav1.Time `json:"renewAt,omitempty"`
}

// RedisMasterSetStatus is the observed state of a RedisMasterSet.
type RedisMasterSetStatus struct {
	// ObservedGeneration is the generation of the spec last acted upon.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Quorum is the number of masters a lock needs (N/2+1).
	// +optional
	Quorum int32 `json:"quorum,omitempty"`
	// Serving is the number of masters that can vote now.
	// +optional
	Serving int32 `json:"serving"`
	// Total is the number of masters.
	// +optional
	Total int32 `json:"total,omitempty"`
	// GateImage is the image the members' gate is copied from:
	// spec.managed.gateImage, or else the operator's image when the set
	// was first run, kept from then on so that upgrading the operator does
	// not restart every member of every set.
	// +optional
	GateImage string `json:"gateImage,omitempty"`
	// TLS describes the certificate the members serve (managed sets with
	// spec.tls).
	// +optional
	TLS *MasterTLSStatus `json:"tls,omitempty"`
	// Members holds each master's state: the list grants are made on
	// (during a membership change, both lists), and members recorded
	// before their first pod.
	// +optional
	// +listType=atomic
	Members []MemberStatus `json:"members,omitempty"`
	// QuarantineWindow is the longest quarantine window known for the
	// set's masters: the set's own (from maxLockTTL), or a longer one that
	// a set sharing the servers (another namespace or cluster, whatever the
	// address it names them by) registered on them, which the operator's
	// clients quarantine restarted masters by. Kept here so that a window
	// learned while the servers were up holds across the operator's
	// restart and theirs, until quarantineWindowUntil.
	// +optional
	QuarantineWindow *metav1.Duration `json:"quarantineWindow,omitempty"`
	// QuarantineWindowUntil is when a longer window lapses unless the set
	// that registered it does so again (twice the window after its last
	// registration); empty while the set's own window is the longest.
	// +optional
	QuarantineWindowUntil *metav1.Time `json:"quarantineWindowUntil,omitempty"`
	// Addresses are the masters locks are granted on: the spec's list once
	// the operator adopted it. An edit of the list is adopted through a
	// membership change (membershipChange), never at once.
	// +optional
	// +listType=atomic
	Addresses []string `json:"addresses,omitempty"`
	// MembershipChange is the change of the list of masters under way, if
	// any: from previous to addresses, with joint quorums.
	// +optional
	MembershipChange *MembershipChange `json:"membershipChange,omitempty"`
	// MembershipEpoch counts the starts and ends of membership changes, so
	// that a view of the set older than the newest change is never acted
	// on.
	// +optional
	MembershipEpoch int64 `json:"membershipEpoch,omitempty"`
	// Conditions: Available, Degraded, OwnQuarantineWindow and
	// MembershipChanging.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MembershipChange is a change of a set's list of masters under way. Until
// it ends, every acquisition, renewal and fencing write-back needs a quorum
// of previous and a quorum of the new list (status.addresses), and masters
// only in the new list do not vote. It ends once every grant made on
// previous alone has expired and the new masters have sat out their
// quarantine window, both counted on the clock of the operator process
// that ends it from when that process stopped using any client of previous
// alone.
type MembershipChange struct {
	// Previous is the list grants were made on before the change.
	// +listType=atomic
	Previous []string `json:"previous"`
	// Since is when the change started.
	Since metav1.Time `json:"since"`
	// Duration is how long the change lasts at least: the longer of the
	// set's quarantine window and its longest lock TTL plus drift and
	// margin.
	Duration metav1.Duration `json:"duration"`
}

// RedisMasterSet is a set of independent Redis masters that arbitrate
// DistributedLocks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rms,categories=redlock
// +kubebuilder:printcolumn:name="Serving",type=integer,JSONPath=`.status.serving`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RedisMasterSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the set: its masters — external (run
	// elsewhere, monitored), managed (run by the operator), or both — and
	// the longest TTL a lock on them may use.
	Spec RedisMasterSetSpec `json:"spec"`
	// Status is the observed state of the masters, written by the operator.
	Status RedisMasterSetStatus `json:"status,omitempty"`
}

// RedisMasterSetList is a list of RedisMasterSets.
//
// +kubebuilder:object:root=true
type RedisMasterSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RedisMasterSet `json:"items"`
}
