package podagent_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

var opts = podagent.Options{Image: "redlock-operator:1"}

func pod(annotations map[string]string, containers ...corev1.Container) *corev1.Pod {
	if len(containers) == 0 {
		containers = []corev1.Container{{Name: "app", Image: "app:1", Command: []string{"/app"}, Args: []string{"--serve", "$(PORT)"}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{v1alpha1.LockLabel: "l"}, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func TestRunModeStartsTheAppThroughTheAgent(t *testing.T) {
	p := pod(map[string]string{v1alpha1.AgentAnnotation: "run", v1alpha1.AgentGraceAnnotation: "3s", v1alpha1.AgentListenAnnotation: "127.0.0.1:8471"})
	changed, err := podagent.Inject(p, opts)
	if err != nil || !changed {
		t.Fatalf("Inject = %v, %v", changed, err)
	}
	app := p.Spec.Containers[0]
	if app.Command[0] != "/redlock/bin/agent" || app.Command[1] != "run" || app.Command[len(app.Command)-1] != "--" {
		t.Errorf("command %q: want /redlock/bin/agent run ... --", app.Command)
	}
	for _, f := range []string{"--grace=3s", "--listen=127.0.0.1:8471", "--state-dir=/redlock/state", "--pod-uid=$(REDLOCK_POD_UID)", "--lock=$(REDLOCK_LOCK)"} {
		if !slices.Contains(app.Command, f) {
			t.Errorf("command %q lacks %s", app.Command, f)
		}
	}
	if want := []string{"/app", "--serve", "$(PORT)"}; !slices.Equal(app.Args, want) {
		t.Errorf("args %q, want the app's command and args %q", app.Args, want)
	}
	env := map[string]string{}
	for _, e := range app.Env {
		env[e.Name] = e.ValueFrom.FieldRef.FieldPath
	}
	if env["REDLOCK_POD_UID"] != "metadata.uid" || env["REDLOCK_LOCK"] != "metadata.labels['redlock.dev/lock']" {
		t.Errorf("downward-API env %v", env)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != opts.Image ||
		!slices.Equal(p.Spec.InitContainers[0].Command, []string{"/agent", "install", "/redlock/bin/agent"}) {
		t.Errorf("init containers %+v: want one that installs the agent from the operator's image", p.Spec.InitContainers)
	}
	if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].EmptyDir == nil {
		t.Errorf("volumes %+v: want the agent's emptyDir", p.Spec.Volumes)
	}
	if want := []corev1.VolumeMount{
		{Name: podagent.Volume, MountPath: "/redlock/bin", SubPath: "bin", ReadOnly: true},
		{Name: podagent.Volume, MountPath: "/redlock/state", SubPath: "state"},
	}; !reflect.DeepEqual(app.VolumeMounts, want) {
		t.Errorf("mounts %+v: want the agent read-only and its state writable", app.VolumeMounts)
	}
	if !podagent.Injected(p) {
		t.Error("Injected = false after Inject")
	}

	again, err := podagent.Inject(p, opts)
	if err != nil || again {
		t.Errorf("a second Inject = %v, %v: want no change (the webhook is reinvoked)", again, err)
	}
}

// TestRunModeWordWait: an agent whose word could not stand for its pod
// (another container, a sidecar, a shared PID namespace) does not wait
// for its grant to be hidden when signalled; the sole container's does.
func TestRunModeWordWait(t *testing.T) {
	run := map[string]string{v1alpha1.AgentAnnotation: "run", v1alpha1.AgentContainerAnnotation: "app"}
	sole := pod(run)
	two := pod(run, corev1.Container{Name: "app", Command: []string{"/app"}}, corev1.Container{Name: "log", Command: []string{"/log"}})
	sidecar := pod(run)
	sidecar.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: new(corev1.ContainerRestartPolicyAlways)}}
	shared := pod(run)
	shared.Spec.ShareProcessNamespace = new(true)
	for _, tc := range []struct {
		name string
		p    *corev1.Pod
		wait bool
	}{{"the sole container", sole, true}, {"two containers", two, false}, {"a sidecar", sidecar, false}, {"a shared PID namespace", shared, false}} {
		if _, err := podagent.Inject(tc.p, opts); err != nil {
			t.Fatalf("%s: Inject: %v", tc.name, err)
		}
		if got := !slices.Contains(tc.p.Spec.Containers[0].Command, "--word-wait=0s"); got != tc.wait {
			t.Errorf("%s: the agent waits for its grant to be hidden = %v, want %v (command %q)", tc.name, got, tc.wait, tc.p.Spec.Containers[0].Command)
		}
		if got := podagent.Sole(tc.p); got != tc.wait {
			t.Errorf("%s: Sole = %v, want %v", tc.name, got, tc.wait)
		}
	}
}

func TestWatchModeAddsASidecarAndMountsTheStateInEveryContainer(t *testing.T) {
	p := pod(map[string]string{v1alpha1.AgentAnnotation: "watch"},
		corev1.Container{Name: "a", Image: "a"}, corev1.Container{Name: "b", Image: "b", Command: []string{"/b"}})
	if changed, err := podagent.Inject(p, opts); err != nil || !changed {
		t.Fatalf("Inject = %v, %v", changed, err)
	}
	side := p.Spec.InitContainers[0]
	if side.Name != podagent.SidecarContainer || side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways ||
		side.Command[0] != "/agent" || side.Command[1] != "watch" {
		t.Errorf("sidecar %+v: want a native sidecar running /agent watch", side)
	}
	for _, c := range p.Spec.Containers {
		if len(c.VolumeMounts) != 1 || !c.VolumeMounts[0].ReadOnly || c.VolumeMounts[0].MountPath != "/redlock/state" {
			t.Errorf("container %s mounts %+v: want /redlock/state read-only", c.Name, c.VolumeMounts)
		}
	}
	if p.Spec.Containers[0].Command != nil || p.Spec.Containers[1].Command[0] != "/b" {
		t.Errorf("watch mode changed a command: %q, %q", p.Spec.Containers[0].Command, p.Spec.Containers[1].Command)
	}
}

func TestInjectRefusesWhatItCannotFollow(t *testing.T) {
	two := []corev1.Container{{Name: "a", Image: "a", Command: []string{"/a"}}, {Name: "b", Image: "b", Command: []string{"/b"}}}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		reason string // a part of the error
	}{
		{"an unknown mode", pod(map[string]string{v1alpha1.AgentAnnotation: "yes"}), `"yes" is not a mode`},
		{"a container without a command", pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, corev1.Container{Name: "app", Image: "app"}), "has no command"},
		{"two containers and none named", pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, two...), "name the one the agent starts"},
		{"a named container that is not there", pod(map[string]string{v1alpha1.AgentAnnotation: "run", v1alpha1.AgentContainerAnnotation: "c"}, two...), `no container named "c"`},
		{"a grace that is not a duration", pod(map[string]string{v1alpha1.AgentAnnotation: "run", v1alpha1.AgentGraceAnnotation: "5"}), "not a duration"},
		{"a negative skew allowance", pod(map[string]string{v1alpha1.AgentAnnotation: "run", v1alpha1.AgentSkewAllowanceAnnotation: "-1s"}), "not a duration"},
		{"an address other pods could reach", pod(map[string]string{v1alpha1.AgentAnnotation: "watch", v1alpha1.AgentListenAnnotation: "0.0.0.0:8471"}), "not a loopback address"},
		{"an address without a port", pod(map[string]string{v1alpha1.AgentAnnotation: "watch", v1alpha1.AgentListenAnnotation: "127.0.0.1"}), "not a loopback address"},
		{"a port that is not a number", pod(map[string]string{v1alpha1.AgentAnnotation: "watch", v1alpha1.AgentListenAnnotation: "localhost:http"}), "the port must be a number"},
		{"the agent's identity set by the container", pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, corev1.Container{Name: "a", Image: "a", Command: []string{"/a"},
			Env: []corev1.EnvVar{{Name: "REDLOCK_POD_UID", Value: "another pod's"}}}), "sets REDLOCK_POD_UID itself"},
		{"no ServiceAccount token", func() *corev1.Pod {
			p := pod(map[string]string{v1alpha1.AgentAnnotation: "run"})
			p.Spec.AutomountServiceAccountToken = new(false)
			return p
		}(), "automountServiceAccountToken"},
		{"a mount at /redlock already", pod(map[string]string{v1alpha1.AgentAnnotation: "watch"}, corev1.Container{Name: "a", Image: "a",
			VolumeMounts: []corev1.VolumeMount{{Name: "x", MountPath: "/redlock/"}}}), "mounts something at or around /redlock"},
		{"a mount under /redlock already", pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, corev1.Container{Name: "a", Image: "a", Command: []string{"/a"},
			VolumeMounts: []corev1.VolumeMount{{Name: "x", MountPath: "/redlock/state"}}}), "mounts something at or around /redlock"},
		{"a liveness probe on the app it starts", pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, corev1.Container{Name: "a", Image: "a", Command: []string{"/a"},
			LivenessProbe: &corev1.Probe{}}), "liveness or startup probe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := podagent.Inject(tc.pod, opts)
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Inject error %v: want one saying %q", err, tc.reason)
			}
		})
	}
}

func TestInjectedIsReadFromTheSpec(t *testing.T) {
	named := pod(map[string]string{v1alpha1.AgentAnnotation: "run"}, corev1.Container{Name: "app", Image: "app", Command: []string{"/app"}})
	named.Spec.InitContainers = []corev1.Container{{Name: podagent.SidecarContainer, Image: "mine", Command: []string{"/my-agent"}}}
	if podagent.Injected(named) {
		t.Error("a user's init container named like the agent's sidecar counts as the agent")
	}
	if changed, err := podagent.Inject(named, opts); err != nil || !changed || !podagent.Injected(named) {
		t.Errorf("Inject = %v, %v: want the app wrapped in spite of the name", changed, err)
	}
}

func TestLeadShort(t *testing.T) {
	for _, tc := range []struct {
		ttl, grace, skew time.Duration
		short            bool
	}{
		{10 * time.Second, 500 * time.Millisecond, 250 * time.Millisecond, false},
		{10 * time.Second, 750 * time.Millisecond, 250 * time.Millisecond, true},
		{60 * time.Second, podagent.DefaultGrace, podagent.DefaultSkewAllowance, false},
		{30 * time.Second, podagent.DefaultGrace, podagent.DefaultSkewAllowance, true},
	} {
		if got := podagent.LeadShort(tc.ttl, tc.grace, tc.skew); got != tc.short {
			t.Errorf("LeadShort(ttl %v, grace %v, skew %v) = %v, want %v", tc.ttl, tc.grace, tc.skew, got, tc.short)
		}
	}
}

func TestInjectLeavesPodsThatDoNotAsk(t *testing.T) {
	p := pod(nil)
	if changed, err := podagent.Inject(p, opts); err != nil || changed || len(p.Spec.InitContainers) != 0 {
		t.Errorf("Inject = %v, %v, init containers %d: want nothing", changed, err, len(p.Spec.InitContainers))
	}
}
