package redismasterset_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var _ = Describe("Managed RedisMasterSet validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	managed := func(name string, mutate func(*v1alpha1.RedisMasterSet)) *v1alpha1.RedisMasterSet {
		ms := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: 30 * time.Second},
				Managed:    &v1alpha1.ManagedMasters{},
			},
		}
		if mutate != nil {
			mutate(ms)
		}
		return ms
	}

	It("defaults replicas 5, persistence None, spread and zoneSpread Preferred, port 6379", func() {
		ms := managed("defaults", nil)
		Expect(k8s.Create(suiteCtx, ms)).To(Succeed())
		m := ms.Spec.Managed
		Expect(m.Replicas).To(Equal(int32(5)))
		Expect(m.Persistence).To(Equal(v1alpha1.PersistenceNone))
		Expect(m.Spread).To(Equal(v1alpha1.SpreadPreferred))
		Expect(m.ZoneSpread).To(Equal(v1alpha1.SpreadPreferred))
		Expect(m.Port).To(Equal(int32(6379)))
		Expect(m.Image).NotTo(BeEmpty())
	})

	It("rejects bad managed specs", func() {
		for name, mutate := range map[string]func(*v1alpha1.RedisMasterSet){
			"even replicas": func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed.Replicas = 4 },
			"zero replicas": func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed.Replicas = -1 },
			"an even total": func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"a:1"}}
			},
			"no mode": func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed = nil },
			"short delay": func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.RestartDelay = &metav1.Duration{Duration: 10 * time.Second}
			},
			"bad persistence": func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed.Persistence = "RDB" },
			"Strict zones with one member": func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas, ms.Spec.Managed.ZoneSpread = 1, v1alpha1.SpreadStrict
			},
			"bad zone spread": func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed.ZoneSpread = "Always" },
		} {
			Expect(k8s.Create(suiteCtx, managed("bad", mutate))).NotTo(Succeed(), name)
		}
		err := k8s.Create(suiteCtx, managed("bad", func(ms *v1alpha1.RedisMasterSet) {
			ms.Spec.Managed.Replicas, ms.Spec.Managed.ZoneSpread = 1, v1alpha1.SpreadStrict
		}))
		Expect(err).To(MatchError(ContainSubstring("zoneSpread Strict needs at least 3 replicas")))
		Expect(k8s.Create(suiteCtx, managed("strict-zones", func(ms *v1alpha1.RedisMasterSet) {
			ms.Spec.Managed.Replicas, ms.Spec.Managed.ZoneSpread = 3, v1alpha1.SpreadStrict
		}))).To(Succeed())
		// A short restart delay is fine when every write is fsynced.
		Expect(k8s.Create(suiteCtx, managed("fsynced", func(ms *v1alpha1.RedisMasterSet) {
			ms.Spec.Managed.Persistence = v1alpha1.PersistenceAOFAlways
			ms.Spec.Managed.RestartDelay = &metav1.Duration{Duration: time.Second}
		}))).To(Succeed())
	})

	It("accepts managed and external members in one set when their total is odd", func() {
		auth := &v1alpha1.SecretKeyRef{Name: "shared-auth"}
		mixed := func(name string, replicas int32, external ...string) *v1alpha1.RedisMasterSet {
			return managed(name, func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas = replicas
				ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: external}
				ms.Spec.AuthSecretRef = auth
			})
		}
		By("a 2/2/1 layout seen from the first cluster, and a 4/1 one")
		Expect(k8s.Create(suiteCtx, mixed("two-here", 2, "w0.example:6379", "w1.example:6379", "n0.example:6379"))).To(Succeed())
		Expect(k8s.Create(suiteCtx, mixed("four-here", 4, "n0.example:6379"))).To(Succeed())

		By("refusing what no quorum can rely on, or that names a member twice")
		for want, ms := range map[string]*v1alpha1.RedisMasterSet{
			"must have an odd number of masters: managed.replicas plus the external addresses": mixed("bad", 2, "w0.example:6379", "w1.example:6379"),
			"exposedAddresses names every member: one address per replica": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas, ms.Spec.Managed.ExposedAddresses = 3, []string{"e0.example:6379"}
			}),
			"an external address is one of this set's own managed members": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas, ms.Spec.Managed.ExposedAddresses = 2, []string{"e0.example:6379", "e1.example:6379"}
				ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"e1.example:6379"}}
				ms.Spec.AuthSecretRef = auth
			}),
			"needs tls.serverSecretRef over TLS: a certificate from a CA the clusters share": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas = 2
				ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"w0.example:6379"}}
				ms.Spec.AuthSecretRef = auth
				ms.Spec.TLS = &v1alpha1.MasterTLS{}
			}),
			"needs authSecretRef: the password every cluster's members share": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.Managed.Replicas = 2
				ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"w0.example:6379"}}
			}),
		} {
			err := k8s.Create(suiteCtx, ms)
			Expect(err).To(HaveOccurred(), want)
			Expect(err.Error()).To(ContainSubstring(want))
		}
		Expect(k8s.Create(suiteCtx, managed("mixed-tls", func(ms *v1alpha1.RedisMasterSet) {
			ms.Spec.Managed.Replicas = 2
			ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"w0.example:6379"}}
			ms.Spec.AuthSecretRef = auth
			ms.Spec.TLS = &v1alpha1.MasterTLS{ServerSecretRef: &v1alpha1.LocalSecretRef{Name: "shared-ca-cert"}}
		}))).To(Succeed())

		By("editing the external part and growing the managed one; never adding or removing the managed part")
		cur := fetchSet(ns, "two-here")
		cur.Spec.External.Addresses = []string{"w0.example:6379", "w2.example:6379", "n0.example:6379"}
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed(), "another cluster's member renamed")
		cur = fetchSet(ns, "two-here")
		cur.Spec.Managed.Replicas = 4
		cur.Spec.External.Addresses = []string{"n0.example:6379"}
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed(), "two members moved into this cluster")
		cur = fetchSet(ns, "two-here")
		cur.Spec.Managed = nil
		cur.Spec.External.Addresses = []string{"a:1", "b:1", "c:1"}
		Expect(k8s.Update(suiteCtx, cur)).To(MatchError(ContainSubstring("managed members cannot be added to or removed from a set")))
		ext := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext-only"},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: 30 * time.Second},
				External:   &v1alpha1.ExternalMasters{Addresses: []string{"a:1", "b:1", "c:1"}},
			},
		}
		Expect(k8s.Create(suiteCtx, ext)).To(Succeed())
		ext.Spec.Managed = &v1alpha1.ManagedMasters{Replicas: 2}
		Expect(k8s.Update(suiteCtx, ext)).To(MatchError(ContainSubstring("managed members cannot be added to or removed from a set")))
	})

	It("keeps persistence and storage immutable, and replicas from shrinking", func() {
		ms := managed("fixed", func(ms *v1alpha1.RedisMasterSet) { ms.Spec.Managed.Replicas = 3 })
		Expect(k8s.Create(suiteCtx, ms)).To(Succeed())
		for want, mutate := range map[string]func(m *v1alpha1.ManagedMasters){
			"replicas may grow, not shrink": func(m *v1alpha1.ManagedMasters) { m.Replicas = 1 },
			"persistence is immutable":      func(m *v1alpha1.ManagedMasters) { m.Persistence = v1alpha1.PersistenceAOFAlways },
			"storage is immutable":          func(m *v1alpha1.ManagedMasters) { m.Storage = &v1alpha1.StorageSpec{} },
		} {
			cur := fetchSet(ns, "fixed")
			mutate(cur.Spec.Managed)
			err := k8s.Update(suiteCtx, cur)
			Expect(err).To(HaveOccurred(), want)
			Expect(err.Error()).To(ContainSubstring(want))
		}
		// Other fields may change (they roll out member by member).
		cur := fetchSet(ns, "fixed")
		cur.Spec.Managed.Image = "redis:7.4"
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
	})

	It("rejects spec.tls fields that do not apply, and keeps a managed set's TLS fixed", func() {
		external := func(t *v1alpha1.MasterTLS) *v1alpha1.RedisMasterSet {
			return &v1alpha1.RedisMasterSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext"},
				Spec: v1alpha1.RedisMasterSetSpec{
					MaxLockTTL: metav1.Duration{Duration: 30 * time.Second},
					External:   &v1alpha1.ExternalMasters{Addresses: []string{"a:1"}},
					TLS:        t,
				},
			}
		}
		ref := &v1alpha1.LocalSecretRef{Name: "cert"}
		for want, ms := range map[string]*v1alpha1.RedisMasterSet{
			"tls.serverSecretRef applies to managed sets only": external(&v1alpha1.MasterTLS{ServerSecretRef: ref}),
			"tls.certificateDuration applies to the certificates the operator issues": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.TLS = &v1alpha1.MasterTLS{ServerSecretRef: ref, CertificateDuration: &metav1.Duration{Duration: 48 * time.Hour}}
			}),
			"certificateDuration must be between 1h and 87600h": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.TLS = &v1alpha1.MasterTLS{CertificateDuration: &metav1.Duration{Duration: 30 * time.Minute}}
			}),
			"tls.caSecretRef applies to external sets and to managed sets with tls.serverSecretRef": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.TLS = &v1alpha1.MasterTLS{CASecretRef: &v1alpha1.CABundleRef{Name: "ca"}}
			}),
			"tls.serverName applies to sets without managed members": managed("bad", func(ms *v1alpha1.RedisMasterSet) {
				ms.Spec.TLS = &v1alpha1.MasterTLS{ServerName: "redis.example"}
			}),
		} {
			err := k8s.Create(suiteCtx, ms)
			Expect(err).To(HaveOccurred(), want)
			Expect(err.Error()).To(ContainSubstring(want))
		}
		Expect(k8s.Create(suiteCtx, external(&v1alpha1.MasterTLS{ServerName: "redis.example", CASecretRef: &v1alpha1.CABundleRef{Name: "ca"}, ClientSecretRef: ref}))).To(Succeed())

		By("turning TLS on, off, or onto another Secret on an existing managed set")
		Expect(k8s.Create(suiteCtx, managed("plain", nil))).To(Succeed())
		Expect(k8s.Create(suiteCtx, managed("tls", func(ms *v1alpha1.RedisMasterSet) { ms.Spec.TLS = &v1alpha1.MasterTLS{ServerSecretRef: ref} }))).To(Succeed())
		for want, change := range map[string]func() error{
			"tls cannot be turned on or off": func() error {
				cur := fetchSet(ns, "plain")
				cur.Spec.TLS = &v1alpha1.MasterTLS{}
				return k8s.Update(suiteCtx, cur)
			},
			"tls cannot be turned on or off ": func() error {
				cur := fetchSet(ns, "tls")
				cur.Spec.TLS = nil
				return k8s.Update(suiteCtx, cur)
			},
			"tls.serverSecretRef of a managed set is immutable": func() error {
				cur := fetchSet(ns, "tls")
				cur.Spec.TLS.ServerSecretRef = &v1alpha1.LocalSecretRef{Name: "other"}
				return k8s.Update(suiteCtx, cur)
			},
		} {
			err := change()
			Expect(err).To(HaveOccurred(), want)
			Expect(err.Error()).To(ContainSubstring(strings.TrimSpace(want)))
		}
	})
})
