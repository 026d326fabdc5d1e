// Package managed renders the Kubernetes objects that run the masters of a
// managed RedisMasterSet — a StatefulSet of independent redis-server
// instances behind the entrypoint gate, a headless Service, the Redis
// configuration, a PodDisruptionBudget and a generated auth Secret — and
// computes the admission of new member pods. Everything here is a pure
// function of the RedisMasterSet; the controller applies the result.
package managed

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/pkg/gate"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Paths inside the member pods.
const (
	GateBinDir      = "/gate-bin"
	GateStateDir    = "/gate/state"
	PodInfoDir      = "/gate/podinfo"
	ConfigDir       = "/etc/redis"
	ACLDir          = "/etc/redis-acl"
	TLSDir          = "/etc/redis-tls"
	DataDir         = "/data"
	AnnotationsFile = PodInfoDir + "/annotations"
)

// Labels and annotations.
const (
	LabelSet          = "redlock.dev/master-set"
	LabelName         = "app.kubernetes.io/name"
	LabelInstance     = "app.kubernetes.io/instance"
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	AnnotationConfig  = "redlock.dev/config-hash"
	AnnotationTLS     = "redlock.dev/tls-hash"
	ServeAfter        = gate.AdmissionAnnotation
	ServeDelay        = gate.AdmissionDelayAnnotation
	PodIndexLabel     = "apps.kubernetes.io/pod-index"
	PasswordKey       = "password"
	restartMargin     = time.Second
	startupSlack      = time.Minute
	probePeriodSecond = 5
)

// SitOut is how long a master that may have forgotten its keys stays out
// of service when its set allows locks of up to maxLockTTL: maxLockTTL plus
// its drift allowance (1% + 2ms) plus a 1s margin.
func SitOut(maxLockTTL time.Duration) time.Duration {
	return maxLockTTL + redlock.Drift(maxLockTTL) + restartMargin
}

// RestartDelay is the set's restart delay: spec.managed.restartDelay or
// SitOut(maxLockTTL).
func RestartDelay(ms *v1alpha1.RedisMasterSet) time.Duration {
	if m := ms.Spec.Managed; m != nil && m.RestartDelay != nil {
		return m.RestartDelay.Duration
	}
	return SitOut(ms.Spec.MaxLockTTL.Duration)
}

// Names of the objects of a set.
type Names struct {
	StatefulSet, Service, Config, PDB, Secret string
}

// NamesOf returns the object names of a set.
func NamesOf(ms *v1alpha1.RedisMasterSet) Names {
	n := ms.Name
	return Names{StatefulSet: n, Service: n, Config: n + "-config", PDB: n, Secret: n + "-auth"}
}

// SecretName is the auth Secret in use: the given one, or the generated one.
func SecretName(ms *v1alpha1.RedisMasterSet) string {
	if ms.Spec.AuthSecretRef != nil {
		return ms.Spec.AuthSecretRef.Name
	}
	return NamesOf(ms).Secret
}

// SecretKey is the password's key in the auth Secret.
func SecretKey(ms *v1alpha1.RedisMasterSet) string {
	if r := ms.Spec.AuthSecretRef; r != nil && r.Key != "" {
		return r.Key
	}
	return PasswordKey
}

// ManagedUser is the Redis ACL user the operator logs in as on managed
// masters; the default user is disabled.
const ManagedUser = "redlock-operator"

// ACLFileKey is the key of the ACL file in the ACL Secret.
const ACLFileKey = "users.acl"

// ACL returns the members' ACL file: the default user off, and ManagedUser
// allowed exactly what the Redlock client needs (redlock.ACLRules), with
// the password stored as its SHA-256; with notices, also the release
// notices' channels and commands (redlock.NoticeACLRules) and the waiting
// lines' commands (redlock.LineACLRules), which came in one release.
func ACL(password string, notices bool) string {
	sum := sha256.Sum256([]byte(password))
	rules := redlock.ACLRules
	if notices {
		rules += " " + redlock.NoticeACLRules + " " + redlock.LineACLRules
	}
	return "user default off\n" +
		"user " + ManagedUser + " on #" + hex.EncodeToString(sum[:]) + " ~* resetchannels " + rules + "\n"
}

// MountedSecret is the Secret the volume of the StatefulSet's pod template
// mounts ("" for none, or no StatefulSet).
func MountedSecret(sts *appsv1.StatefulSet, volume string) string {
	if sts == nil {
		return ""
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// NewDefaults reports whether the members of a set should run what this
// version adds by default: the ACL with release notices and waiting lines,
// and the zone rule Preferred. A new set's do; a running set's members
// keep what they run until they roll for another reason (a new password or
// gate image), so that upgrading the operator does not roll every set.
// live is the set's StatefulSet (nil: none yet), gateImage the one it is
// rendered with now.
func NewDefaults(ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet, password, gateImage string) bool {
	if live == nil {
		return true
	}
	secret, image := MountedSecret(live, aclVolume), ""
	for _, c := range live.Spec.Template.Spec.InitContainers {
		if c.Name == gateContainer {
			image = c.Image
		}
	}
	return secret != ACLSecretName(ms, ACL(password, false)) || image != gateImage
}

// ACLSecretName names the Secret holding acl: by its content, so that a
// new password is a new Secret and rolls the members one at a time.
func ACLSecretName(ms *v1alpha1.RedisMasterSet, acl string) string {
	sum := sha256.Sum256([]byte(acl))
	return ms.Name + "-acl-" + hex.EncodeToString(sum[:5])
}

// Addresses returns the members' addresses for the Redlock client: the DNS
// names of the headless Service, or, with hostNetwork, 127.0.0.1:port+i —
// host-network members bind loopback only, for single-node clusters without
// a pod network where the operator runs on the same node.
func Addresses(ms *v1alpha1.RedisMasterSet) []string {
	m := ms.Spec.Managed
	n := NamesOf(ms)
	out := make([]string, m.Replicas)
	for i := range out {
		if m.HostNetwork {
			out[i] = fmt.Sprintf("127.0.0.1:%d", int(m.Port)+i)
			continue
		}
		out[i] = fmt.Sprintf("%s-%d.%s.%s.svc:%d", n.StatefulSet, i, n.Service, ms.Namespace, m.Port)
	}
	return out
}

// Config returns redis.conf. Users and passwords come from the ACL file (a
// Secret volume), never from the command line or the environment; with
// hostNetwork the port is passed on the command line.
func Config(ms *v1alpha1.RedisMasterSet) string {
	m := ms.Spec.Managed
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by redlock-operator for RedisMasterSet %s/%s. Do not edit.\n", ms.Namespace, ms.Name)
	bind := "0.0.0.0"
	switch {
	case m.HostNetwork && len(m.ExposedAddresses) == 0:
		bind = "127.0.0.1" // host network: never expose a lock master beyond the node unless asked
	case m.HostNetwork:
		bind = "* -::*" // every address of the node, IPv6 where it has it
	}
	fmt.Fprintf(&b, "bind %s\nprotected-mode yes\n", bind)
	if ms.Spec.TLS != nil {
		// TLS only: no plaintext port. Clients authenticate with their ACL
		// password, not with certificates.
		fmt.Fprintf(&b, "port 0\ntls-port %d\ntls-cert-file %s/%s\ntls-key-file %s/%s\ntls-auth-clients no\n", m.Port, TLSDir, certs.CertKey, TLSDir, certs.KeyKey)
	} else {
		fmt.Fprintf(&b, "port %d\n", m.Port)
	}
	fmt.Fprintf(&b, "aclfile %s/%s\n", ACLDir, ACLFileKey)
	b.WriteString("# Evicting lock keys would break mutual exclusion.\nmaxmemory-policy noeviction\n")
	b.WriteString("# No replication: the masters are independent.\nreplica-read-only yes\n")
	fmt.Fprintf(&b, "dir %s\nsave \"\"\n", DataDir)
	switch m.Persistence {
	case v1alpha1.PersistenceAOFAlways:
		b.WriteString("appendonly yes\nappendfsync always\n")
	case v1alpha1.PersistenceAOFEverySec:
		b.WriteString("appendonly yes\nappendfsync everysec\n")
	default:
		b.WriteString("appendonly no\n")
	}
	return b.String()
}

// ConfigHash identifies the configuration a pod was started with: a change
// rolls the members one at a time.
func ConfigHash(ms *v1alpha1.RedisMasterSet) string {
	h := sha256.Sum256([]byte(Config(ms)))
	return hex.EncodeToString(h[:8])
}

// ManagedByValue is the value of LabelManagedBy on every object a managed
// set owns (the manager caches only those).
const ManagedByValue = "redlock-operator"

// Labels selects the members of a set.
func Labels(ms *v1alpha1.RedisMasterSet) map[string]string {
	return map[string]string{
		LabelName:      "redis",
		LabelInstance:  ms.Name,
		LabelSet:       ms.Name,
		LabelManagedBy: ManagedByValue,
	}
}

// DefaultProbeInterval is how often the RedisMasterSet controller probes
// the masters when no interval is configured.
const DefaultProbeInterval = 10 * time.Second

// probeSlack covers the RedisMasterSet controller's own work around a
// probe: lastServingAt is the instant its reconcile started, read before its
// API calls and before the probe itself, and the next probe is queued one
// interval after the reconcile ended, not after it started.
const probeSlack = time.Second

// ProbeLag bounds how long a member may have kept serving after the
// lastServingAt recorded for it, with probes every interval (zero:
// DefaultProbeInterval) each bounded by probeTimeout: the probe that saw it
// serving is stamped with the instant its reconcile started, and the next
// probe, which finds it gone, answers at most an interval, a probe timeout
// and the controller's own work (probeSlack) later.
func ProbeLag(interval, probeTimeout time.Duration) time.Duration {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	return interval + probeTimeout + probeSlack
}

// AdmitAt computes when a new pod of a member may serve: a member that
// never served may serve now; when nothing is known of the member, now +
// restartDelay. seen is when this very process last saw the member serving,
// on its own clock, when that is what status records (nil otherwise): the
// member may have kept serving, unseen, until seen + probeLag (see
// ProbeLag), so its new pod may serve at seen + probeLag + restartDelay (its
// keys are gone; locks granted on them are valid until then). A
// lastServingAt another process wrote (an earlier leader, on another node's
// clock) is not compared with this process's clock: the new pod then waits
// a full restartDelay from now. So does one whose end has not been observed
// at all (the last probe still found it serving): it served until its pod
// was replaced, at the latest now (a StatefulSet creates the new pod only
// once the old one is gone) — which also covers probes that stalled.
//
// The pod's gate counts the delay from this instant (the
// redlock.dev/serve-delay annotation) on its own clock: see AdmissionDelay.
func AdmitAt(member *v1alpha1.MemberStatus, seen *time.Time, restartDelay, probeLag time.Duration, now time.Time) time.Time {
	switch {
	case member == nil || (member.LastServingAt == nil && !member.NeverServed):
		return now.Add(restartDelay)
	case member.LastServingAt == nil:
		return now
	case seen == nil:
		return now.Add(restartDelay)
	default:
		end := seen.Add(probeLag)
		if member.State == v1alpha1.MemberServing && end.Before(now) {
			end = now
		}
		at := end.Add(restartDelay)
		if at.Before(now) {
			return now
		}
		return at
	}
}

// AdmissionDelay is the value of the redlock.dev/serve-delay annotation for
// a pod admitted at at, computed now: how long its gate keeps Redis back
// from when it reads the annotation, which is after now. Each side measures
// a duration on its own clock; no instant of one is compared on the other.
// It is rounded up to the millisecond.
func AdmissionDelay(at, now time.Time) string {
	d := max(at.Sub(now), 0)
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}
