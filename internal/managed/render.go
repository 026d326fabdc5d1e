package managed

import (
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
)

// votingMargin covers the whole-second uptime clients read when they
// quarantine a restarted member: they count it a second short, and it may
// already be almost two seconds short (two truncated clocks, one cached).
const votingMargin = 3 * time.Second

// Options are the operator-wide inputs of rendering.
type Options struct {
	// GateImage is the operator's image, which carries the gate binary.
	GateImage string
	// ACLSecret is the Secret holding the members' ACL file (ACLSecret).
	ACLSecret string
	// OperatorNamespace is where the operator's pods run: the members'
	// NetworkPolicy admits them.
	OperatorNamespace string
	// TLS is the certificate the members serve (sets with spec.tls).
	TLS *Serving
	// NewDefaults: the members run this version's defaults (NewDefaults),
	// here the zone rule Preferred.
	NewDefaults bool
}

// Serving names the Secret (tls.crt, tls.key) the members of a TLS set
// serve, and a hash of its content: a new certificate, even in the same
// Secret, rolls the members one at a time.
type Serving struct {
	Secret, Hash string
}

// OperatorPodLabels select the operator's manager pods (config/manager).
var OperatorPodLabels = map[string]string{"app.kubernetes.io/name": "redlock-operator", "control-plane": "controller-manager"}

// NetworkPolicy admits to the members' Redis port only the operator's pods
// (and the set's allowedClients): any other pod of the cluster could
// otherwise reach the lock keys.
func NetworkPolicy(ms *v1alpha1.RedisMasterSet, o Options) *networkingv1.NetworkPolicy {
	m := ms.Spec.Managed
	port := intstr.FromInt32(m.Port)
	tcp := corev1.ProtocolTCP
	peers := []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: o.OperatorNamespace}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: OperatorPodLabels},
	}}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: meta(ms, NamesOf(ms).StatefulSet),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: Labels(ms)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				From:  append(peers, m.AllowedClients...),
			}},
		},
	}
}

func meta(ms *v1alpha1.RedisMasterSet, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: ms.Namespace, Labels: Labels(ms)}
}

// ConfigMap holds redis.conf.
func ConfigMap(ms *v1alpha1.RedisMasterSet) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: meta(ms, NamesOf(ms).Config),
		Data:       map[string]string{"redis.conf": Config(ms)},
	}
}

// Service is the headless Service whose DNS names address the members. It
// publishes members that are not ready: quarantine is the client's call.
func Service(ms *v1alpha1.RedisMasterSet) *corev1.Service {
	m := ms.Spec.Managed
	return &corev1.Service{
		ObjectMeta: meta(ms, NamesOf(ms).Service),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 Labels(ms),
			Ports:                    []corev1.ServicePort{{Name: "redis", Port: m.Port, TargetPort: intstr.FromInt32(m.Port)}},
		},
	}
}

// PodDisruptionBudget lets a voluntary disruption take down at most one
// member at a time.
func PodDisruptionBudget(ms *v1alpha1.RedisMasterSet) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: meta(ms, NamesOf(ms).PDB),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: &one,
			Selector:       &metav1.LabelSelector{MatchLabels: Labels(ms)},
		},
	}
}

// Secret is the generated auth Secret (used when spec.authSecretRef is not
// given), labelled as Redis credentials; password must be fresh random text.
func Secret(ms *v1alpha1.RedisMasterSet, password string) *corev1.Secret {
	m := meta(ms, NamesOf(ms).Secret)
	m.Labels[v1alpha1.RedisCredentialsLabel] = "true"
	return &corev1.Secret{
		ObjectMeta: m,
		Data:       map[string][]byte{PasswordKey: []byte(password)},
	}
}

// aclVolume, TLSVolume and gateContainer name the ACL file's and the
// serving certificate's volumes and the init container that copies the
// gate in the members' pod template.
const (
	aclVolume     = "acl"
	TLSVolume     = "tls"
	gateContainer = "install-gate"
)

// ACLSecret holds the members' ACL file (see ACL), named by its content.
func ACLSecret(ms *v1alpha1.RedisMasterSet, acl string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(ms, ACLSecretName(ms, acl)),
		Immutable:  new(true),
		Data:       map[string][]byte{ACLFileKey: []byte(acl)},
	}
}

// MemberUID is the user and group the members run as by default.
const MemberUID = 999

// podSecurity is the members' pod security context: the set's, or one that
// meets Pod Security "restricted".
func podSecurity(m *v1alpha1.ManagedMasters) *corev1.PodSecurityContext {
	if m.PodSecurityContext != nil {
		return m.PodSecurityContext
	}
	return &corev1.PodSecurityContext{
		RunAsNonRoot: new(true), RunAsUser: new(int64(MemberUID)), RunAsGroup: new(int64(MemberUID)), FSGroup: new(int64(MemberUID)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// containerSecurity is the members' containers' security context: the
// set's, or one that meets Pod Security "restricted".
func containerSecurity(m *v1alpha1.ManagedMasters) *corev1.SecurityContext {
	if m.ContainerSecurityContext != nil {
		return m.ContainerSecurityContext
	}
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// resources are the Redis container's: the set's, with requests defaulted.
func resources(m *v1alpha1.ManagedMasters) corev1.ResourceRequirements {
	r := *m.Resources.DeepCopy()
	if len(r.Requests) == 0 {
		r.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
		// A limit alone defaults the request to it: keep that.
		for k, v := range r.Limits {
			r.Requests[k] = v
		}
	}
	return r
}

// StatefulSet runs the members: independent masters (no replication),
// started in parallel, each behind the gate, updated one at a time.
func StatefulSet(ms *v1alpha1.RedisMasterSet, o Options) *appsv1.StatefulSet {
	m := ms.Spec.Managed
	n := NamesOf(ms)
	delay := RestartDelay(ms)
	labels := Labels(ms)
	replicas := m.Replicas

	gateArgs := []string{
		"--state-dir=" + GateStateDir,
		"--restart-delay=" + delay.String(),
		"--persistence=" + m.Persistence,
		"--admission-file=" + AnnotationsFile,
	}
	probe := []string{GateBinDir + "/gate", "probe", "--port=" + strconv.Itoa(int(m.Port))}
	if o.TLS != nil {
		gateArgs = append(gateArgs, "--tls")
		probe = append(probe, "--tls")
	}
	if m.HostNetwork {
		// Member i listens on port+i: the gate adds the ordinal.
		gateArgs = append(gateArgs, "--port-base="+strconv.Itoa(int(m.Port)), "--ordinal-env=POD_INDEX")
		probe = append(probe, "--ordinal-env=POD_INDEX")
	}
	// Ready means voting: clients quarantine a restarted member for the
	// restart delay after they first reach it (its uptime is read in whole
	// seconds), so a rolling update moves on only when the replaced member
	// counts again — one member out at a time.
	// A set with external members quarantines every restarted master for
	// at least SitOut (masters.Quarantine), AOFAlways too.
	quarantine := delay
	if ms.Spec.External != nil {
		quarantine = max(delay, SitOut(ms.Spec.MaxLockTTL.Duration))
	}
	ready := append(append([]string(nil), probe...), "--state-dir="+GateStateDir, "--voting-after="+(quarantine+votingMargin).String())
	if m.Persistence == v1alpha1.PersistenceAOFAlways && delay <= ms.Spec.MaxLockTTL.Duration && ms.Spec.External == nil {
		ready = probe // no client quarantine (see masters.Quarantine)
	}
	args := append(gateArgs, "--", "redis-server", ConfigDir+"/redis.conf")

	execProbe := func(cmd []string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			FailureThreshold: failures,
		}
	}
	// The startup probe lets a member wait out its restart delay (and an
	// admission) without being killed: readiness stays false meanwhile.
	startupFailures := int32((delay+startupSlack).Seconds()/probePeriodSecond) + 1

	volumes := []corev1.Volume{
		{Name: "gate-bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "gate-state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}},
		}}},
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: n.Config},
		}}},
		{Name: aclVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: o.ACLSecret, DefaultMode: new(int32(0o440)),
		}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "gate-bin", MountPath: GateBinDir, ReadOnly: true},
		{Name: "gate-state", MountPath: GateStateDir},
		{Name: "podinfo", MountPath: PodInfoDir, ReadOnly: true},
		{Name: "config", MountPath: ConfigDir, ReadOnly: true},
		{Name: aclVolume, MountPath: ACLDir, ReadOnly: true},
		{Name: "data", MountPath: DataDir},
	}
	annotations := map[string]string{AnnotationConfig: ConfigHash(ms)}
	if o.TLS != nil {
		volumes = append(volumes, corev1.Volume{Name: TLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  o.TLS.Secret,
			Items:       []corev1.KeyToPath{{Key: certs.CertKey, Path: certs.CertKey}, {Key: certs.KeyKey, Path: certs.KeyKey}},
			DefaultMode: new(int32(0o440)),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: TLSVolume, MountPath: TLSDir, ReadOnly: true})
		annotations[AnnotationTLS] = o.TLS.Hash
	}
	var claims []corev1.PersistentVolumeClaim
	if m.Persistence == v1alpha1.PersistenceNone {
		volumes = append(volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	} else {
		size := resource.MustParse("1Gi")
		var class *string
		if m.Storage != nil {
			size, class = m.Storage.Size, m.Storage.StorageClassName
		}
		claims = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}}
	}

	dnsPolicy := corev1.DNSClusterFirst
	if m.HostNetwork {
		dnsPolicy = corev1.DNSClusterFirstWithHostNet
	}
	grace := int64(30)
	// Host-network members listen on port+i: a declared (host) port would
	// keep every member but one from scheduling on a node.
	ports := []corev1.ContainerPort{{Name: "redis", ContainerPort: m.Port}}
	if m.HostNetwork {
		ports = nil
	}

	return &appsv1.StatefulSet{
		ObjectMeta: meta(ms, n.StatefulSet),
		Spec: appsv1.StatefulSetSpec{
			Replicas:            &replicas,
			ServiceName:         n.Service,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// The operator replaces outdated members itself, one voting
			// member at a time (see NextToReplace).
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      labels,
					Annotations: annotations,
				},
				Spec: corev1.PodSpec{
					HostNetwork:                   m.HostNetwork,
					DNSPolicy:                     dnsPolicy,
					SecurityContext:               podSecurity(m),
					AutomountServiceAccountToken:  new(false), // members never call the API server
					PriorityClassName:             m.PriorityClassName,
					TerminationGracePeriodSeconds: &grace,
					NodeSelector:                  m.NodeSelector,
					Tolerations:                   m.Tolerations,
					ImagePullSecrets:              m.ImagePullSecrets,
					Affinity:                      m.Affinity,
					TopologySpreadConstraints:     spreadConstraints(m, labels, o.NewDefaults),
					InitContainers: []corev1.Container{{
						Name:            gateContainer,
						Image:           o.GateImage,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/gate", "install", GateBinDir + "/gate"},
						SecurityContext: containerSecurity(m),
						VolumeMounts:    []corev1.VolumeMount{{Name: "gate-bin", MountPath: GateBinDir}},
					}},
					Containers: []corev1.Container{{
						Name:            "redis",
						Image:           m.Image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{GateBinDir + "/gate"},
						Args:            args,
						Env: []corev1.EnvVar{
							{Name: "POD_INDEX", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
								FieldPath: fmt.Sprintf("metadata.labels['%s']", PodIndexLabel),
							}}},
						},
						Ports:           ports,
						Resources:       resources(m),
						SecurityContext: containerSecurity(m),
						StartupProbe:    execProbe(probe, probePeriodSecond, startupFailures),
						ReadinessProbe:  execProbe(ready, 2, 1),
						LivenessProbe:   execProbe(probe, 10, 3),
						VolumeMounts:    mounts,
					}},
					Volumes: volumes,
				},
			},
			VolumeClaimTemplates: claims,
		},
	}
}

// spreadConstraints spread the members across nodes (spread) and zones
// (zoneSpread). A Strict zone rule lets no zone hold a quorum: at most a
// quorum less one member per zone (maxSkew quorum−1 with minDomains =
// replicas, so that with fewer zones than members the scheduler counts
// the emptiest as holding none), and no member on a node without the zone
// label. Preferred is rendered for members that run this version's
// defaults (newDefaults).
func spreadConstraints(m *v1alpha1.ManagedMasters, labels map[string]string, newDefaults bool) []corev1.TopologySpreadConstraint {
	members := &metav1.LabelSelector{MatchLabels: labels}
	nodes := corev1.ScheduleAnyway
	if m.Spread == v1alpha1.SpreadStrict {
		nodes = corev1.DoNotSchedule
	}
	out := []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: nodes, LabelSelector: members}}
	switch {
	case m.ZoneSpread == v1alpha1.SpreadStrict:
		// Every member counts, wherever it runs: with Honor, a new
		// nodeSelector or affinity would hide the members still on the
		// old nodes from the rule while they roll.
		replicas, ignore := m.Replicas, corev1.NodeInclusionPolicyIgnore
		out = append(out, corev1.TopologySpreadConstraint{
			MaxSkew: replicas / 2, MinDomains: &replicas, TopologyKey: corev1.LabelTopologyZone,
			WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: members,
			NodeAffinityPolicy: &ignore, NodeTaintsPolicy: &ignore,
		})
	case m.ZoneSpread != v1alpha1.SpreadNone && newDefaults:
		out = append(out, corev1.TopologySpreadConstraint{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: members})
	}
	return out
}
