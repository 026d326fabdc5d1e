//go:build e2e

package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// tlsBasePort is the first port of the TLS set's host-network members.
const tlsBasePort = 17200

var _ = Describe("a managed set with TLS", Ordered, func() {
	const ttl = 3 * time.Second
	secure := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure"},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: ttl},
			Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Image: "redis:7-local", Port: tlsBasePort, HostNetwork: true},
			TLS:        &v1alpha1.MasterTLS{},
		},
	}
	fetch := func() *v1alpha1.RedisMasterSet {
		cur := &v1alpha1.RedisMasterSet{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(secure), cur)).To(Succeed())
		return cur
	}
	serving := func(g Gomega) {
		cur := fetch()
		g.Expect(meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha1.ConditionAvailable)).To(BeTrue(), "%+v", cur.Status.Conditions)
		g.Expect(cur.Status.Serving).To(BeEquivalentTo(3))
	}
	secretData := func(name, key string) []byte {
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
		return s.Data[key]
	}
	// presented is the certificate member i presents (DER).
	presented := func(i int) []byte {
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tlsBasePort+i), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate, trusts nothing
		if err != nil {
			return nil
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	BeforeAll(func() {
		Expect(k8s.Create(ctx, secure)).To(Succeed())
		removeAfterSpec(secure)
		Eventually(serving, 3*time.Minute, time.Second).Should(Succeed(), "master set %s/%s to serve its 3 members over TLS", ns, secure.Name)
	})

	// member is an authenticated TLS client of member i, verified against
	// the operator's CA.
	member := func(i int) *redis.Client {
		pool, err := certs.Pool(secretData("secure-tls-ca", certs.CAKey))
		Expect(err).NotTo(HaveOccurred())
		return redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", tlsBasePort+i), Username: managed.ManagedUser,
			Password:        string(secretData(managed.NamesOf(secure).Secret, managed.PasswordKey)),
			DisableIdentity: true, MaxRetries: -1, TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	}
	// values is what each member holds for key ("" when nothing, or the
	// member does not answer). The operator's ACL user may GET but not
	// PTTL; a key Redis returns has not expired.
	values := func(key string) []string {
		out := make([]string, 3)
		for i := range out {
			c := member(i)
			if v, err := c.Get(ctx, key).Result(); err == nil {
				out[i] = v
			}
			_ = c.Close()
		}
		return out
	}
	holding := func(key, value string) int {
		n := 0
		for _, v := range values(key) {
			if v == value {
				n++
			}
		}
		return n
	}

	It("serves TLS only, with a certificate of the operator's CA for the members' addresses", func() {
		password := string(secretData(managed.NamesOf(secure).Secret, managed.PasswordKey))
		for i := range 3 {
			addr := fmt.Sprintf("127.0.0.1:%d", tlsBasePort+i)
			By("refusing plaintext on " + addr)
			plain := redis.NewClient(&redis.Options{Addr: addr, Username: managed.ManagedUser, Password: password, DisableIdentity: true, MaxRetries: -1})
			Expect(plain.Ping(ctx).Err()).To(HaveOccurred())
			_ = plain.Close()
			By("answering over TLS, verified against the CA for the IP the client dials")
			secured := member(i)
			Expect(secured.Ping(ctx).Err()).To(Succeed())
			_ = secured.Close()
		}
	})

	It("renews the certificate by rolling the members one at a time, without a lapse of the lock held on them", func() {
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure-holder"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: "secure", Key: "e2e/secure", TTL: metav1.Duration{Duration: ttl}, HolderIdentity: "tls"},
		}
		Expect(k8s.Create(ctx, l)).To(Succeed())
		Eventually(func() bool { return held(get(l)) }, time.Minute, 100*time.Millisecond).Should(BeTrue(), "lock %s/%s to be held on master set %s", ns, l.Name, secure.Name)
		token := get(l).Status.FencingToken
		value := values("e2e/secure")[0]
		Expect(value).NotTo(BeEmpty(), "member 0 holds no value of e2e/secure")
		Expect(holding("e2e/secure", value)).To(BeNumerically(">=", 2), "a majority of the members hold the grant")
		old := fetch().Status.TLS.SecretName

		By("deleting the serving Secret, which is how a user renews the certificate now")
		Expect(k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: old}})).To(Succeed())
		var renewed string
		Eventually(func() string { renewed = fetch().Status.TLS.SecretName; return renewed }, time.Minute, 200*time.Millisecond).ShouldNot(Equal(old), "master set %s/%s to issue a new serving Secret in place of deleted %s", ns, secure.Name, old)
		block, _ := pem.Decode(secretData(renewed, certs.CertKey))
		Expect(block).NotTo(BeNil())

		By("sampling the lock while the members roll: held by the same grant; whenever status shows its validity past (status writes behind on a loaded machine), a majority of the members still hold the grant")
		rolled := func() bool {
			sts := &appsv1.StatefulSet{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "secure"}, sts)).To(Succeed())
			s := sts.Status
			return s.ObservedGeneration == sts.Generation && s.UpdateRevision == s.CurrentRevision && s.UpdatedReplicas == 3 && s.ReadyReplicas == 3
		}
		start, samples, behind := time.Now(), 0, 0
		for !rolled() || !bytes.Equal(presented(0), block.Bytes) {
			Expect(time.Since(start)).To(BeNumerically("<", 5*time.Minute), "the roll did not end")
			cur := get(l)
			Expect(held(cur)).To(BeTrue(), "the lock lapsed during the roll: %+v", cur.Status)
			Expect(cur.Status.FencingToken).To(Equal(token), "the lock was granted again during the roll")
			if !cur.Status.ValidUntil.After(time.Now()) {
				behind++
				Expect(holding("e2e/secure", value)).To(BeNumerically(">=", 2),
					"status shows a validity that has passed (%v) and a majority of the members no longer hold the grant", cur.Status.ValidUntil)
			}
			samples++
			time.Sleep(100 * time.Millisecond)
		}
		Expect(holding("e2e/secure", value)).To(BeNumerically(">=", 2), "a majority of the members hold the grant after the roll")
		GinkgoWriter.Printf("roll onto the renewed certificate: %v, %d samples of the lock, no lapse; %d samples showed a validity already passed while the members held the grant\n",
			time.Since(start), samples, behind)
		for i := range 3 {
			Expect(presented(i)).To(Equal(block.Bytes), "member %d serves the renewed certificate", i)
		}
		Eventually(serving, time.Minute, time.Second).Should(Succeed(), "master set %s/%s to serve its 3 members over TLS after the roll", ns, secure.Name)
		Expect(get(l).Status.FencingToken).To(Equal(token))
	})
})
