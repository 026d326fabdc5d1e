package managed

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

func set(mutate func(*v1alpha1.ManagedMasters)) *v1alpha1.RedisMasterSet {
	ms := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "locks"},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: 30 * time.Second},
			Managed: &v1alpha1.ManagedMasters{
				Replicas: 5, Image: "redis:7.2", Port: 6379, Persistence: v1alpha1.PersistenceNone, Spread: v1alpha1.SpreadPreferred,
			},
		},
	}
	if mutate != nil {
		mutate(ms.Spec.Managed)
	}
	return ms
}

func TestRestartDelayDefault(t *testing.T) {
	if got, want := RestartDelay(set(nil)), 30*time.Second+300*time.Millisecond+2*time.Millisecond+time.Second; got != want {
		t.Fatalf("default restart delay %v, want %v", got, want)
	}
	ms := set(func(m *v1alpha1.ManagedMasters) { m.RestartDelay = &metav1.Duration{Duration: time.Minute} })
	if RestartDelay(ms) != time.Minute {
		t.Fatal("spec restartDelay ignored")
	}
}

func TestRenderPerPersistence(t *testing.T) {
	for _, tc := range []struct {
		persistence string
		conf        []string
		claim       bool
	}{
		{v1alpha1.PersistenceNone, []string{"appendonly no"}, false},
		{v1alpha1.PersistenceAOFEverySec, []string{"appendonly yes", "appendfsync everysec"}, true},
		{v1alpha1.PersistenceAOFAlways, []string{"appendonly yes", "appendfsync always"}, true},
	} {
		t.Run(tc.persistence, func(t *testing.T) {
			ms := set(func(m *v1alpha1.ManagedMasters) {
				m.Persistence = tc.persistence
				m.Storage = &v1alpha1.StorageSpec{Size: resource.MustParse("2Gi")}
			})
			conf := ConfigMap(ms).Data["redis.conf"]
			for _, want := range append(tc.conf, "maxmemory-policy noeviction", "protected-mode yes", "save \"\"", "bind 0.0.0.0") {
				if !strings.Contains(conf, want+"\n") {
					t.Errorf("redis.conf lacks %q:\n%s", want, conf)
				}
			}
			sts := StatefulSet(ms, Options{GateImage: "op:1"})
			if got := len(sts.Spec.VolumeClaimTemplates) == 1; got != tc.claim {
				t.Errorf("claim template = %v, want %v", got, tc.claim)
			}
			if tc.claim && sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String() != "2Gi" {
				t.Errorf("claim size %v", sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage())
			}
			args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " ")
			if !strings.Contains(args, "--persistence="+tc.persistence) || !strings.Contains(args, "--restart-delay=31.302s") {
				t.Errorf("gate args %q", args)
			}
		})
	}
}

func TestRenderStatefulSet(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) {
		m.NodeSelector = map[string]string{"disk": "ssd"}
		m.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		m.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
	})
	sts := StatefulSet(ms, Options{GateImage: "op:1"})
	spec := sts.Spec
	if *spec.Replicas != 5 || spec.PodManagementPolicy != "Parallel" || spec.ServiceName != "locks" {
		t.Errorf("replicas %d, policy %s, service %s", *spec.Replicas, spec.PodManagementPolicy, spec.ServiceName)
	}
	pod := spec.Template.Spec
	if pod.InitContainers[0].Image != "op:1" || pod.InitContainers[0].Command[1] != "install" {
		t.Errorf("init container %+v", pod.InitContainers[0])
	}
	c := pod.Containers[0]
	if c.Command[0] != "/gate-bin/gate" || !strings.HasSuffix(strings.Join(c.Args, " "), "-- redis-server /etc/redis/redis.conf") {
		t.Errorf("command %v %v", c.Command, c.Args)
	}
	// The startup probe tolerates the whole restart delay plus slack.
	sp := c.StartupProbe
	if allowed := time.Duration(sp.PeriodSeconds*sp.FailureThreshold) * time.Second; allowed < RestartDelay(ms)+time.Minute {
		t.Errorf("startup probe allows %v, less than the restart delay %v", allowed, RestartDelay(ms))
	}
	if rp := strings.Join(c.ReadinessProbe.Exec.Command, " "); !strings.Contains(rp, "--voting-after="+(RestartDelay(ms)+votingMargin).String()) {
		t.Errorf("readiness %q does not wait for the member to vote again", rp)
	}
	if lp := strings.Join(c.LivenessProbe.Exec.Command, " "); strings.Contains(lp, "voting-after") {
		t.Errorf("liveness %q would kill a quarantined member", lp)
	}
	if pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.ScheduleAnyway || pod.TopologySpreadConstraints[0].TopologyKey != corev1.LabelHostname {
		t.Errorf("spread %+v", pod.TopologySpreadConstraints[0])
	}
	if pod.NodeSelector["disk"] != "ssd" || pod.Tolerations[0].Key != "dedicated" {
		t.Error("scheduling knobs not passed through")
	}
	if len(pod.ImagePullSecrets) != 1 || pod.ImagePullSecrets[0].Name != "registry" {
		t.Errorf("image pull secrets %v, want the set's [registry]", pod.ImagePullSecrets)
	}
	if spec.Template.Annotations[AnnotationConfig] != ConfigHash(ms) {
		t.Error("config hash annotation missing")
	}
	strict := StatefulSet(set(func(m *v1alpha1.ManagedMasters) { m.Spread = v1alpha1.SpreadStrict }), Options{})
	if strict.Spec.Template.Spec.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Error("strict spread does not refuse to share nodes")
	}
}

// The password reaches no command line and no environment: users come from
// the ACL file, on a Secret volume, with the password as its SHA-256.
func TestRenderKeepsThePasswordOffCommandLinesAndEnvironments(t *testing.T) {
	ms := set(nil)
	const password = "correct horse battery staple"
	acl := ACL(password, true)
	sec := ACLSecret(ms, acl)
	sts := StatefulSet(ms, Options{GateImage: "op:1", ACLSecret: sec.Name})
	pod := sts.Spec.Template.Spec
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		if len(c.EnvFrom) > 0 {
			t.Errorf("container %s takes its environment from %+v", c.Name, c.EnvFrom)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("container %s: env %s from Secret %s", c.Name, e.Name, e.ValueFrom.SecretKeyRef.Name)
			}
		}
		if cmd := strings.Join(append(c.Command, c.Args...), " "); strings.Contains(cmd, "requirepass") || strings.Contains(cmd, "$(") {
			t.Errorf("container %s command line %q", c.Name, cmd)
		}
	}
	var mounted bool
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == sec.Name && *v.Secret.DefaultMode == 0o440 {
			mounted = true
		}
		if v.Secret != nil && v.Secret.SecretName == SecretName(ms) {
			t.Errorf("the password Secret %s is mounted", v.Secret.SecretName)
		}
	}
	if !mounted {
		t.Errorf("the ACL Secret %s is not mounted: %+v", sec.Name, pod.Volumes)
	}
	if !strings.Contains(Config(ms), "aclfile "+ACLDir+"/"+ACLFileKey) {
		t.Errorf("redis.conf does not load the ACL file:\n%s", Config(ms))
	}
	if strings.Contains(acl, password) || !strings.Contains(acl, "user default off") || !strings.Contains(acl, "user "+ManagedUser+" on #") {
		t.Errorf("ACL file:\n%s", acl)
	}
	if !*sec.Immutable || ACLSecretName(ms, ACL("another", true)) == sec.Name {
		t.Error("a new password must be a new, immutable ACL Secret (which rolls the members)")
	}
}

// A new set's members run the ACL with release notices; a running set's
// keep the ACL they run until they roll for another reason, so that an
// operator upgrade rolls no set.
func TestNewDefaults(t *testing.T) {
	ms := set(nil)
	const password, image = "pw", "op:2"
	running := func(notices bool, password, image string) *appsv1.StatefulSet {
		return StatefulSet(ms, Options{GateImage: image, ACLSecret: ACLSecretName(ms, ACL(password, notices))})
	}
	for _, c := range []struct {
		name string
		live *appsv1.StatefulSet
		want bool
	}{
		{"a new set", nil, true},
		{"members running notices", running(true, password, image), true},
		{"members running the ACL before notices, nothing else changing", running(false, password, image), false},
		{"members running the ACL before notices, a new gate image rolling them", running(false, password, "op:1"), true},
		{"members running another password's ACL, rolling for the new one", running(false, "old", image), true},
	} {
		if got := NewDefaults(ms, c.live, password, image); got != c.want {
			t.Errorf("%s: ACL with notices %v, want %v", c.name, got, c.want)
		}
	}
	if !strings.Contains(ACL(password, true), redlock.NoticeACLRules+" "+redlock.LineACLRules) || strings.Contains(ACL(password, false), "publish") || strings.Contains(ACL(password, false), "zadd") {
		t.Errorf("ACL files:\n%s\n%s", ACL(password, true), ACL(password, false))
	}
}

func TestRenderNetworkPolicy(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) {
		m.AllowedClients = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "monitor"}}}}
	})
	np := NetworkPolicy(ms, Options{OperatorNamespace: "ops"})
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress || len(np.Spec.Ingress) != 1 {
		t.Fatalf("policy %+v", np.Spec)
	}
	from := np.Spec.Ingress[0].From
	if len(from) != 2 || from[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "ops" || from[1].PodSelector.MatchLabels["app"] != "monitor" {
		t.Errorf("peers %+v", from)
	}
	if p := np.Spec.Ingress[0].Ports; len(p) != 1 || p[0].Port.IntValue() != int(ms.Spec.Managed.Port) {
		t.Errorf("ports %+v", p)
	}
}

func TestRenderHostNetwork(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) { m.HostNetwork = true; m.Port = 7000; m.Replicas = 3 })
	sts := StatefulSet(ms, Options{})
	pod := sts.Spec.Template.Spec
	args := strings.Join(pod.Containers[0].Args, " ")
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet || !strings.Contains(args, "--port-base=7000 --ordinal-env=POD_INDEX") {
		t.Errorf("host network pod: %v %v %q", pod.HostNetwork, pod.DNSPolicy, args)
	}
	if len(pod.Containers[0].Ports) != 0 {
		t.Error("a host-network member declares a port: the others could not schedule beside it")
	}
	if !strings.Contains(ConfigMap(ms).Data["redis.conf"], "bind 127.0.0.1\n") {
		t.Error("a host-network member binds beyond loopback")
	}
	got := Addresses(ms)
	if want := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("addresses %v, want %v", got, want)
	}
	if got := Addresses(set(nil)); got[4] != "locks-4.locks.ns.svc:6379" {
		t.Errorf("DNS address %v", got[4])
	}
}

func TestRenderServicePDBSecret(t *testing.T) {
	ms := set(nil)
	svc := Service(ms)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("service %+v", svc.Spec)
	}
	pdb := PodDisruptionBudget(ms)
	if pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable %v", pdb.Spec.MaxUnavailable)
	}
	if s := Secret(ms, "pw"); s.Name != "locks-auth" || string(s.Data["password"]) != "pw" {
		t.Errorf("secret %+v", s)
	}
	ms.Spec.AuthSecretRef = &v1alpha1.SecretKeyRef{Name: "mine", Key: "pass"}
	if SecretName(ms) != "mine" || SecretKey(ms) != "pass" {
		t.Error("the given auth Secret is not used")
	}
}

func TestProbeLag(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		interval, probeTimeout time.Duration
		want                   time.Duration
	}{
		{"a member may serve unseen for an interval, a probe timeout and the controller's slack", 10 * time.Second, 200 * time.Millisecond, 11200 * time.Millisecond},
		{"an unset interval is the controller's default", 0, 200 * time.Millisecond, DefaultProbeInterval + 1200*time.Millisecond},
		{"a short interval gives a short lag", 500 * time.Millisecond, 50 * time.Millisecond, 1550 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProbeLag(tc.interval, tc.probeTimeout); got != tc.want {
				t.Errorf("ProbeLag(%v, %v) = %v, want %v", tc.interval, tc.probeTimeout, got, tc.want)
			}
		})
	}
}

func TestAdmitAt(t *testing.T) {
	now := time.Unix(10_000, 0)
	delay := 31 * time.Second
	lag := ProbeLag(10*time.Second, 200*time.Millisecond) // 11.2s
	seen := func(state string, ago time.Duration) *v1alpha1.MemberStatus {
		return &v1alpha1.MemberStatus{State: state, LastServingAt: &metav1.Time{Time: now.Add(-ago)}}
	}
	for _, tc := range []struct {
		name   string
		member *v1alpha1.MemberStatus
		want   time.Time
	}{
		{"an unknown member waits a full delay", nil, now.Add(delay)},
		{"a member that never served is admitted at once", &v1alpha1.MemberStatus{NeverServed: true}, now},
		{"a record without history waits a full delay", &v1alpha1.MemberStatus{State: v1alpha1.MemberDown}, now.Add(delay)},
		{"a member found down, last seen serving 10s ago, waits the delay from the end of the next probe's window",
			seen(v1alpha1.MemberDown, 10*time.Second), now.Add(-10 * time.Second).Add(lag).Add(delay)},
		{"a member found down just after it was last seen serving waits the probe lag beyond the delay",
			seen(v1alpha1.MemberDown, 0), now.Add(lag).Add(delay)},
		{"a member found down, last seen serving exactly a lag and a delay ago, is admitted now",
			seen(v1alpha1.MemberDown, lag+delay), now},
		{"a member found down long ago is admitted now", seen(v1alpha1.MemberDown, time.Hour), now},
		{"a member still seen serving by the last probe 3s ago waits the delay from the end of the probe's window",
			seen(v1alpha1.MemberServing, 3*time.Second), now.Add(-3 * time.Second).Add(lag).Add(delay)},
		{"a member still seen serving by a probe long ago (probes stalled) may have served until now and waits a full delay",
			seen(v1alpha1.MemberServing, time.Hour), now.Add(delay)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var own *time.Time
			if tc.member != nil && tc.member.LastServingAt != nil {
				own = &tc.member.LastServingAt.Time
			}
			if got := AdmitAt(tc.member, own, delay, lag, now); !got.Equal(tc.want) {
				t.Errorf("AdmitAt = now%+v, want now%+v", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
	// A lastServingAt another process wrote (an earlier leader, stamped on
	// another node's clock) is not compared with this one's.
	for _, ago := range []time.Duration{10 * time.Second, time.Hour} {
		if got := AdmitAt(seen(v1alpha1.MemberDown, ago), nil, delay, lag, now); !got.Equal(now.Add(delay)) {
			t.Errorf("AdmitAt of a member another process saw serving %v ago = now%+v, want a full delay from now", ago, got.Sub(now))
		}
	}
}

// TestRenderTLS: a TLS set's members listen on tls-port only (host-network
// members too, through the gate), probe over TLS, mount only the certificate
// and key, and roll when the certificate changes.
func TestRenderTLS(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) { m.HostNetwork = true })
	ms.Spec.TLS = &v1alpha1.MasterTLS{}
	conf := Config(ms)
	if !strings.Contains(conf, "port 0\ntls-port 6379\n") || !strings.Contains(conf, "tls-cert-file "+TLSDir+"/tls.crt\n") {
		t.Fatalf("redis.conf of a TLS set:\n%s", conf)
	}
	sts := StatefulSet(ms, Options{TLS: &Serving{Secret: "locks-tls-abc", Hash: "h1"}})
	c := sts.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--tls") || !slices.Contains(c.ReadinessProbe.Exec.Command, "--tls") || !slices.Contains(c.LivenessProbe.Exec.Command, "--tls") {
		t.Fatalf("gate args %v, readiness %v: want --tls", c.Args, c.ReadinessProbe.Exec.Command)
	}
	var vol *corev1.SecretVolumeSource
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "tls" {
			vol = v.Secret
		}
	}
	if vol == nil || vol.SecretName != "locks-tls-abc" || len(vol.Items) != 2 {
		t.Fatalf("tls volume %+v: want tls.crt and tls.key of locks-tls-abc", vol)
	}
	renewed := StatefulSet(ms, Options{TLS: &Serving{Secret: "locks-tls-abc", Hash: "h2"}})
	if renewed.Spec.Template.Annotations[AnnotationTLS] == sts.Spec.Template.Annotations[AnnotationTLS] {
		t.Fatal("a renewed certificate in the same Secret does not change the pod template")
	}
	plain := set(nil)
	if strings.Contains(Config(plain), "tls") || slices.Contains(StatefulSet(plain, Options{}).Spec.Template.Spec.Containers[0].Args, "--tls") {
		t.Fatal("a set without spec.tls renders TLS")
	}
}

func TestNextToReplace(t *testing.T) {
	// flags: o outdated, r Ready, s serving, d Down, t terminating.
	pod := func(ord int, flags string) MemberPod {
		return MemberPod{
			Name: "m-" + strconv.Itoa(ord), Ordinal: ord,
			Outdated: strings.Contains(flags, "o"), Ready: strings.Contains(flags, "r"),
			Serving: strings.Contains(flags, "s"), Down: strings.Contains(flags, "d"), Terminating: strings.Contains(flags, "t"),
		}
	}
	for _, tc := range []struct {
		name   string
		pods   []MemberPod
		others Others
		want   string
		voting bool
	}{
		{name: "nothing outdated", pods: []MemberPod{pod(0, "rs"), pod(1, "rs"), pod(2, "rs")}},
		{name: "all healthy: the highest outdated ordinal, by eviction", pods: []MemberPod{pod(0, "ors"), pod(1, "ors"), pod(2, "rs")}, want: "m-1", voting: true},
		{name: "a replaced member not Ready yet: wait", pods: []MemberPod{pod(0, "ors"), pod(1, "ors"), pod(2, "")}},
		{name: "a replaced member Ready but not counted by the operator yet: wait", pods: []MemberPod{pod(0, "ors"), pod(1, "ors"), pod(2, "r")}},
		{name: "a pod terminating: wait", pods: []MemberPod{pod(0, "ors"), pod(1, "orst"), pod(2, "rs")}},
		{name: "a pod missing: wait", pods: []MemberPod{pod(0, "ors"), pod(1, "ors")}},
		{name: "members of a new set, voting before they report Ready: none goes", pods: []MemberPod{pod(0, "os"), pod(1, "os"), pod(2, "os")}},
		{name: "an outdated member Down and not Ready goes first, deleted", pods: []MemberPod{pod(0, "ors"), pod(1, "od"), pod(2, "ors")}, want: "m-1"},
		{name: "two Down outdated members: the higher first", pods: []MemberPod{pod(0, "od"), pod(1, "ors"), pod(2, "od")}, want: "m-2"},
		{name: "an outdated member quarantined (about to vote) while another is replaced: wait", pods: []MemberPod{pod(0, "o"), pod(1, ""), pod(2, "rs")}},
		{name: "an outdated member Down but Ready while another is replaced: wait", pods: []MemberPod{pod(0, "ord"), pod(1, ""), pod(2, "rs"), pod(3, "rs"), pod(4, "rs")}},
		{name: "the same without a quorum serving: it goes, nothing is lost", pods: []MemberPod{pod(0, "ord"), pod(1, ""), pod(2, "rs")}, want: "m-0"},
		{name: "Down but Ready members when no quorum serves (a CA the clients no longer trust): one goes", pods: []MemberPod{pod(0, "ord"), pod(1, "ord"), pod(2, "ord")}, want: "m-2"},
		{name: "the last Down but Ready outdated member once the rest serve", pods: []MemberPod{pod(0, "ord"), pod(1, "rs"), pod(2, "rs")}, want: "m-0"},
		{name: "an outdated member Ready but not serving (probe lag) waits", pods: []MemberPod{pod(0, "ors"), pod(1, "or"), pod(2, "rs")}},
		{name: "an up-to-date member down blocks healthy members", pods: []MemberPod{pod(0, "ors"), pod(1, "ors"), pod(2, "d")}},

		{name: "2 here and 3 elsewhere, all serving: one goes", pods: []MemberPod{pod(0, "ors"), pod(1, "ors")}, others: Others{Total: 3, Serving: 3}, want: "m-1", voting: true},
		{name: "2 here and 3 elsewhere, one of those down: one goes (3 of 5 left)", pods: []MemberPod{pod(0, "ors"), pod(1, "ors")}, others: Others{Total: 3, Serving: 2}, want: "m-1", voting: true},
		{name: "2 here and 3 elsewhere, two of those down: none goes (2 of 5 would be left)", pods: []MemberPod{pod(0, "ors"), pod(1, "ors")}, others: Others{Total: 3, Serving: 1}},
		{name: "2 here and 3 elsewhere, serving: a Down but Ready outdated member waits while the other here is replaced", pods: []MemberPod{pod(0, "ord"), pod(1, "")}, others: Others{Total: 3, Serving: 3}},
		{name: "2 here and 3 elsewhere, one serving: the Down but Ready outdated member goes (no quorum to keep)", pods: []MemberPod{pod(0, "ord"), pod(1, "")}, others: Others{Total: 3, Serving: 1}, want: "m-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replicas := max(3, len(tc.pods))
			if tc.others.Total > 0 {
				replicas = len(tc.pods)
			}
			got := NextToReplace(tc.pods, replicas, tc.others)
			if got.Name != tc.want || got.Voting != tc.voting {
				t.Fatalf("NextToReplace = %+v, want %q (voting %v)", got, tc.want, tc.voting)
			}
			if got.Name == "" && got.Wait == "" {
				t.Fatal("no pod and no reason")
			}
		})
	}
}

func TestAdmissionDelay(t *testing.T) {
	now := time.Unix(10_000, 0)
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now, "0s"},
		{now.Add(-time.Hour), "0s"},
		{now.Add(7060 * time.Millisecond), "7.06s"},
		{now.Add(7060*time.Millisecond + time.Nanosecond), "7.061s"}, // rounded up, never down
	} {
		if got := AdmissionDelay(tc.at, now); got != tc.want {
			t.Errorf("AdmissionDelay(now%+v) = %s, want %s", tc.at.Sub(now), got, tc.want)
		}
	}
}

// TestSpreadConstraints: members spread over nodes and zones; Strict zones
// let no zone hold a quorum (minDomains counts missing zones as empty);
// Preferred zones only for members on this version's defaults, so that an
// upgrade rolls no set.
func TestSpreadConstraints(t *testing.T) {
	zoneRule := func(m func(*v1alpha1.ManagedMasters), newDefaults bool) *corev1.TopologySpreadConstraint {
		ms := set(m)
		var zone *corev1.TopologySpreadConstraint
		cs := StatefulSet(ms, Options{NewDefaults: newDefaults}).Spec.Template.Spec.TopologySpreadConstraints
		for i := range cs {
			switch cs[i].TopologyKey {
			case corev1.LabelTopologyZone:
				zone = &cs[i]
			case corev1.LabelHostname:
			default:
				t.Fatalf("constraint on %s", cs[i].TopologyKey)
			}
		}
		if cs[0].TopologyKey != corev1.LabelHostname {
			t.Fatalf("no node spread first: %+v", cs)
		}
		return zone
	}
	for _, c := range []struct {
		replicas, maxSkew int32
	}{{3, 1}, {5, 2}, {7, 3}, {15, 7}} {
		z := zoneRule(func(m *v1alpha1.ManagedMasters) { m.Replicas, m.ZoneSpread = c.replicas, v1alpha1.SpreadStrict }, false)
		if z == nil || z.MaxSkew != c.maxSkew || z.MinDomains == nil || *z.MinDomains != c.replicas || z.WhenUnsatisfiable != corev1.DoNotSchedule ||
			z.NodeAffinityPolicy == nil || *z.NodeAffinityPolicy != corev1.NodeInclusionPolicyIgnore {
			t.Errorf("Strict, %d replicas: %+v, want maxSkew %d (a quorum less one), minDomains %d", c.replicas, z, c.maxSkew, c.replicas)
		}
	}
	if z := zoneRule(func(m *v1alpha1.ManagedMasters) { m.ZoneSpread = v1alpha1.SpreadPreferred }, true); z == nil || z.MaxSkew != 1 || z.WhenUnsatisfiable != corev1.ScheduleAnyway || z.MinDomains != nil {
		t.Errorf("Preferred: %+v", z)
	}
	if z := zoneRule(func(m *v1alpha1.ManagedMasters) { m.ZoneSpread = v1alpha1.SpreadPreferred }, false); z != nil {
		t.Errorf("Preferred on members running an earlier version's defaults: %+v, want none (no roll on upgrade)", z)
	}
	if z := zoneRule(func(m *v1alpha1.ManagedMasters) { m.ZoneSpread = v1alpha1.SpreadNone }, true); z != nil {
		t.Errorf("None: %+v", z)
	}
}

func TestExposedAddresses(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) {
		m.HostNetwork, m.Port, m.Replicas = true, 7000, 2
		m.ExposedAddresses = []string{"10.0.0.5:7000", "redis-1.east.example:7001"}
	})
	if conf := Config(ms); !strings.Contains(conf, "bind * -::*\n") {
		t.Errorf("host-network members exposed to other clusters bind loopback only:\n%s", conf)
	}
	if Addresses(ms)[1] != "127.0.0.1:7001" {
		t.Errorf("the set's own address of member 1 is %q: other clusters' addresses are theirs", Addresses(ms)[1])
	}
	req := ServingRequest(ms, time.Now())
	if !slices.Contains(req.DNSNames, "redis-1.east.example") || !slices.ContainsFunc(req.IPs, func(ip net.IP) bool { return ip.String() == "10.0.0.5" }) {
		t.Errorf("serving certificate names %v %v: want the exposed hosts too", req.DNSNames, req.IPs)
	}
	if !slices.Contains(req.DNSNames, "localhost") {
		t.Errorf("serving certificate names %v: the set's own names are gone", req.DNSNames)
	}
	if ConfigHash(ms) == ConfigHash(set(func(m *v1alpha1.ManagedMasters) { m.HostNetwork, m.Port, m.Replicas = true, 7000, 2 })) {
		t.Error("exposing host-network members does not roll them")
	}
}

// A set with external members quarantines restarted masters for at least
// SitOut, AOFAlways too: its members are Ready (voting) only after that.
func TestReadyAfterTheQuarantineOfMixedSets(t *testing.T) {
	ms := set(func(m *v1alpha1.ManagedMasters) {
		m.Replicas, m.Persistence, m.RestartDelay = 2, v1alpha1.PersistenceAOFAlways, &metav1.Duration{Duration: time.Second}
	})
	ready := func(ms *v1alpha1.RedisMasterSet) string {
		return strings.Join(StatefulSet(ms, Options{}).Spec.Template.Spec.Containers[0].ReadinessProbe.Exec.Command, " ")
	}
	if strings.Contains(ready(ms), "voting-after") {
		t.Fatalf("an AOFAlways set alone waits to vote: %s", ready(ms))
	}
	ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"w:1"}}
	if want := "--voting-after=" + (SitOut(ms.Spec.MaxLockTTL.Duration) + votingMargin).String(); !strings.Contains(ready(ms), want) {
		t.Fatalf("readiness of a set with external members %q: want %s", ready(ms), want)
	}
}
