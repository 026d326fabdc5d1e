// Package podagent decides how the in-pod agent (cmd/agent) is added to a
// pod that asks for it with the annotation redlock.dev/agent, at admission:
// a pure function over the pod and the operator's image, which the pod
// gate webhook (controllers/podgate) applies.
//
// In "run" mode an init container copies /agent from the operator's image
// into an emptyDir, and the app container's command becomes
//
//	/redlock/bin/agent run [flags] -- <command> <args>
//
// so that the app runs only as the agent's child. The container must name
// its command. The binary is mounted read-only, the state directory
// /redlock/state writable. A liveness or startup probe on that container
// is refused, and so is a container that sets the agent's identity
// variables. In "watch" mode a native sidecar runs `agent watch`, and
// every app container reads the grant from /redlock/state. The agent
// learns its pod and lock from the downward API (REDLOCK_POD_* and
// REDLOCK_LOCK, passed as flags).
// The reasoning: docs/design/agent.md#how-it-is-added.
package podagent

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Names the injection uses in the pod.
const (
	// Dir is where the agent's volume is mounted: the binary in BinDir, the
	// published grant in StateDir.
	Dir = "/redlock"
	// BinDir holds the agent (run mode), mounted read-only in the app.
	BinDir = Dir + "/bin"
	// Agent is the agent's path in the app container (run mode).
	Agent = BinDir + "/agent"
	// imageAgent is the agent's path in the operator's image.
	imageAgent = "/agent"
	// StateDir is where the agent publishes grant.json and token.
	StateDir = Dir + "/state"
	// Volume is the emptyDir holding the agent and its state.
	Volume = "redlock-agent"
	// InstallContainer is the init container that copies the agent (run
	// mode).
	InstallContainer = "redlock-agent-install"
	// SidecarContainer is the native sidecar running `agent watch` (watch
	// mode).
	SidecarContainer = "redlock-agent"
)

// Options are what the injection needs from the operator.
type Options struct {
	// Image is the operator's image, which carries /agent.
	Image string
}

// Wanted reports whether pod asks for the agent.
func Wanted(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[v1alpha1.AgentAnnotation]
	return ok
}

// Injected reports whether pod has the agent: a container started through
// it (run mode) or its sidecar (watch mode). Unlike the annotation, which
// anyone who may edit the pod can change, this is fixed at creation.
func Injected(pod *corev1.Pod) bool {
	sidecar := func(c corev1.Container) bool {
		return c.Name == SidecarContainer && len(c.Command) > 1 && c.Command[0] == imageAgent && c.Command[1] == "watch"
	}
	return RunsApp(pod) || slices.ContainsFunc(pod.Spec.InitContainers, sidecar)
}

// RunsApp reports whether the agent starts one of pod's containers (run
// mode), as fixed at creation: that container runs only under a current
// grant, and is stopped by the grant's fencing deadline, whether or not
// the agent can reach the API server.
func RunsApp(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return len(c.Command) > 0 && c.Command[0] == Agent })
}

// Sole reports whether pod's one container is all that may run in it,
// with a PID namespace of its own: no other container, no sidecar
// (restartable init container), no ephemeral container, no PID namespace
// shared with the other containers or the host. In run mode the agent is
// then its container's first process, and what it stops and reaps is
// everything in the pod that could act on a grant: its word that the app
// stopped stands for the whole pod (controllers/distributedlock).
func Sole(pod *corev1.Pod) bool {
	return len(pod.Spec.Containers) == 1 && len(pod.Spec.EphemeralContainers) == 0 && !pod.Spec.HostPID &&
		(pod.Spec.ShareProcessNamespace == nil || !*pod.Spec.ShareProcessNamespace) &&
		!slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool {
			return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		})
}

// Inject adds the agent to pod as its annotations ask, and reports whether
// it changed pod; or it returns an error that says what is wrong with them
// (and pod may be half changed: the webhook then refuses the pod). A pod
// that has the agent already is left as it is.
func Inject(pod *corev1.Pod, o Options) (bool, error) {
	if !Wanted(pod) || Injected(pod) {
		return false, nil
	}
	return true, inject(pod, o)
}

func inject(pod *corev1.Pod, o Options) error {
	mode := pod.Annotations[v1alpha1.AgentAnnotation]
	flags, err := agentFlags(pod.Annotations)
	if err != nil {
		return err
	}
	if a := pod.Spec.AutomountServiceAccountToken; a != nil && !*a {
		return fmt.Errorf("%s: the agent reads its lock through the API server with the pod's ServiceAccount token, and the pod sets automountServiceAccountToken: false", v1alpha1.AgentAnnotation)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == Volume {
			return fmt.Errorf("%s: the pod has a volume named %q already", v1alpha1.AgentAnnotation, Volume)
		}
	}
	switch mode {
	case v1alpha1.AgentRun:
		i, err := target(pod)
		if err != nil {
			return err
		}
		if !Sole(pod) {
			// Its word would not count: signalled, it need not wait for
			// its grant to be hidden.
			flags = append(flags, "--word-wait=0s")
		}
		if err := wrap(&pod.Spec.Containers[i], flags); err != nil {
			return err
		}
		pod.Spec.InitContainers = append([]corev1.Container{install(o)}, pod.Spec.InitContainers...)
	case v1alpha1.AgentWatch:
		for i := range pod.Spec.Containers {
			if err := mount(&pod.Spec.Containers[i], corev1.VolumeMount{Name: Volume, MountPath: StateDir, SubPath: "state", ReadOnly: true}); err != nil {
				return err
			}
		}
		pod.Spec.InitContainers = append([]corev1.Container{sidecar(o, flags)}, pod.Spec.InitContainers...)
	default:
		return fmt.Errorf("%s: %q is not a mode: use %q (the agent starts and stops the app) or %q (it only publishes the grant)",
			v1alpha1.AgentAnnotation, mode, v1alpha1.AgentRun, v1alpha1.AgentWatch)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: Volume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: new(resource.MustParse("128Mi"))},
	}})
	return nil
}

// target is the index of the container the agent wraps: the one the
// annotation redlock.dev/agent-container names, or the only one.
func target(pod *corev1.Pod) (int, error) {
	name, named := pod.Annotations[v1alpha1.AgentContainerAnnotation]
	if !named {
		if len(pod.Spec.Containers) != 1 {
			return 0, fmt.Errorf("%s: the pod has %d containers: name the one the agent starts in the annotation %s",
				v1alpha1.AgentAnnotation, len(pod.Spec.Containers), v1alpha1.AgentContainerAnnotation)
		}
		return 0, nil
	}
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		return 0, fmt.Errorf("%s: the pod has no container named %q", v1alpha1.AgentContainerAnnotation, name)
	}
	return i, nil
}

// agentFlags are the agent's flags common to both modes, from the pod's
// annotations.
func agentFlags(annotations map[string]string) ([]string, error) {
	flags := []string{
		"--state-dir=" + StateDir,
		"--lock=$(REDLOCK_LOCK)",
		"--namespace=$(REDLOCK_POD_NAMESPACE)",
		"--pod-name=$(REDLOCK_POD_NAME)",
		"--pod-uid=$(REDLOCK_POD_UID)",
	}
	for _, d := range []struct{ annotation, flag string }{
		{v1alpha1.AgentGraceAnnotation, "--grace"},
		{v1alpha1.AgentSkewAllowanceAnnotation, "--skew-allowance"},
	} {
		v, ok := annotations[d.annotation]
		if !ok {
			continue
		}
		if p, err := time.ParseDuration(v); err != nil || p < 0 {
			return nil, fmt.Errorf("%s: %q is not a duration of zero or more, such as 5s", d.annotation, v)
		}
		flags = append(flags, d.flag+"="+v)
	}
	if v, ok := annotations[v1alpha1.AgentListenAnnotation]; ok {
		host, port, err := net.SplitHostPort(v)
		if n, perr := strconv.ParseUint(port, 10, 16); err == nil && (perr != nil || n == 0) {
			return nil, fmt.Errorf("%s: %q: the port must be a number from 1 to 65535", v1alpha1.AgentListenAnnotation, v)
		}
		if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			return nil, fmt.Errorf("%s: %q is not a loopback address with a port, such as 127.0.0.1:8471 (the grant is served to the pod only)",
				v1alpha1.AgentListenAnnotation, v)
		}
		flags = append(flags, "--listen="+v)
	}
	return flags, nil
}

// env is what the agent learns from the downward API.
func env() []corev1.EnvVar {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	return []corev1.EnvVar{
		field("REDLOCK_POD_NAME", "metadata.name"),
		field("REDLOCK_POD_NAMESPACE", "metadata.namespace"),
		field("REDLOCK_POD_UID", "metadata.uid"),
		field("REDLOCK_LOCK", fmt.Sprintf("metadata.labels['%s']", v1alpha1.LockLabel)),
	}
}

// wrap makes c start through the agent.
func wrap(c *corev1.Container, flags []string) error {
	if len(c.Command) == 0 {
		return fmt.Errorf("%s: container %q has no command: the agent starts the app, so it needs the command the image's ENTRYPOINT would run; set it in the container's command",
			v1alpha1.AgentAnnotation, c.Name)
	}
	if c.LivenessProbe != nil || c.StartupProbe != nil {
		return fmt.Errorf("%s: container %q has a liveness or startup probe: the agent runs the app only while the pod holds the lock, so the probe would fail on every passive pod and the kubelet would restart it; remove the probe, or use %s: %s and let the app manage itself",
			v1alpha1.AgentAnnotation, c.Name, v1alpha1.AgentAnnotation, v1alpha1.AgentWatch)
	}
	for _, e := range c.Env {
		if slices.ContainsFunc(env(), func(a corev1.EnvVar) bool { return a.Name == e.Name }) {
			return fmt.Errorf("%s: container %q sets %s itself: the agent learns its pod and lock from it, through the downward API; remove it",
				v1alpha1.AgentAnnotation, c.Name, e.Name)
		}
	}
	for _, m := range []corev1.VolumeMount{
		{Name: Volume, MountPath: BinDir, SubPath: "bin", ReadOnly: true},
		{Name: Volume, MountPath: StateDir, SubPath: "state"},
	} {
		if err := mount(c, m); err != nil {
			return err
		}
	}
	args := append(slices.Clone(c.Command), c.Args...)
	c.Command = append(append([]string{Agent, "run"}, flags...), "--")
	c.Args = args
	c.Env = append(env(), c.Env...)
	return nil
}

// mount adds m to c, unless c mounts something else at Dir, under it or
// above it already.
func mount(c *corev1.Container, m corev1.VolumeMount) error {
	if slices.ContainsFunc(c.VolumeMounts, func(cur corev1.VolumeMount) bool {
		p := strings.TrimSuffix(cur.MountPath, "/")
		return cur.Name != Volume && (p == Dir || strings.HasPrefix(p, Dir+"/") || strings.HasPrefix(Dir, p+"/") || p == "")
	}) {
		return fmt.Errorf("%s: container %q mounts something at or around %s already", v1alpha1.AgentAnnotation, c.Name, Dir)
	}
	c.VolumeMounts = append(c.VolumeMounts, m)
	return nil
}

// install is the init container that copies the agent into the volume.
func install(o Options) corev1.Container {
	return corev1.Container{
		Name:            InstallContainer,
		Image:           o.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{imageAgent, "install", Agent},
		Resources:       resources(),
		SecurityContext: restricted(),
		VolumeMounts:    []corev1.VolumeMount{{Name: Volume, MountPath: Dir}},
	}
}

// sidecar is the native sidecar that publishes the grant (watch mode).
func sidecar(o Options, flags []string) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	return corev1.Container{
		Name:            SidecarContainer,
		Image:           o.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         append([]string{imageAgent, "watch"}, flags...),
		Env:             env(),
		RestartPolicy:   &always,
		Resources:       resources(),
		SecurityContext: restricted(),
		VolumeMounts:    []corev1.VolumeMount{{Name: Volume, MountPath: StateDir, SubPath: "state"}},
	}
}

// resources are the agent containers' requests and limits: a LimitRange
// or ResourceQuota may require them.
func resources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
}

// restricted is a container security context that meets Pod Security
// "restricted", as the operator image's user (a pod that runs as root
// would otherwise pass its user down, against runAsNonRoot).
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser:                new(int64(65532)),
		RunAsGroup:               new(int64(65532)),
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		RunAsNonRoot:             new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// Defaults of the agent's flags (cmd/agent) that the webhook's checks use.
const (
	DefaultGrace         = 5 * time.Second
	DefaultSkewAllowance = 250 * time.Millisecond
)

// RefreshLead is the least time before the validity shown for a lock of
// ttl passes that the operator refreshes it: a tenth of the ttl (its status
// writer may refresh earlier, never later).
func RefreshLead(ttl time.Duration) time.Duration { return ttl / 10 }

// LeadShort reports whether an agent with grace and skew would stop its app
// before the operator refreshes the validity shown for a lock of ttl: the
// agent stops the app grace plus the skew allowance before the validity it
// saw passes.
func LeadShort(ttl, grace, skew time.Duration) bool {
	return grace+skew >= RefreshLead(ttl)
}

// Timing is the grace and skew allowance the pod's annotations give its
// agent (the defaults where they give none, or do not parse).
func Timing(pod *corev1.Pod) (grace, skew time.Duration) {
	grace, skew = DefaultGrace, DefaultSkewAllowance
	if d, err := time.ParseDuration(pod.Annotations[v1alpha1.AgentGraceAnnotation]); err == nil {
		grace = d
	}
	if d, err := time.ParseDuration(pod.Annotations[v1alpha1.AgentSkewAllowanceAnnotation]); err == nil {
		skew = d
	}
	return grace, skew
}
