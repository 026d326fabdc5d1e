//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var _ = Describe("managed members' Redis users", func() {
	It("admit only the operator's ACL user, and that user only to the commands the client needs", func() {
		secret := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: managed.NamesOf(set).Secret}, secret)).To(Succeed())
		password := string(secret.Data[managed.PasswordKey])
		addr := fmt.Sprintf("127.0.0.1:%d", basePort+4)
		login := func(user, pass string) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass, DisableIdentity: true, MaxRetries: -1})
			DeferCleanup(c.Close)
			return c
		}

		// Specs run one at a time, but an earlier one may have crashed it.
		Eventually(func() bool { return serves(basePort + 4) }, 2*time.Minute, 200*time.Millisecond).Should(BeTrue(), "member 4 of master set %s/%s to serve on port %d", ns, set.Name, basePort+4)

		By("refusing the default user, with or without the password")
		Expect(login("", "").Ping(ctx).Err()).To(MatchError(ContainSubstring("NOAUTH")))
		Expect(login("", password).Ping(ctx).Err()).To(HaveOccurred())
		Expect(login("default", password).Ping(ctx).Err()).To(HaveOccurred())

		By("letting the operator's user lock, and nothing else")
		op := login(managed.ManagedUser, password)
		Eventually(func() error { return op.Ping(ctx).Err() }).Should(Succeed(), "user %s to log in to member 4 of master set %s/%s", managed.ManagedUser, ns, set.Name)
		Expect(op.Set(ctx, "acl-probe", "v", 0).Err()).To(Succeed())
		Expect(op.Del(ctx, "acl-probe").Err()).To(Succeed())
		// Release notices, as the members' ACL file says: a set first run
		// by this operator has them; one rolled by an older operator (the
		// upgrade spec's rollback) keeps that ACL until its members roll
		// again for another reason.
		sts := &appsv1.StatefulSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: managed.NamesOf(set).StatefulSet}, sts)).To(Succeed())
		aclSecret := &corev1.Secret{}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, set.Name+"-acl-") {
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.Secret.SecretName}, aclSecret)).To(Succeed())
			}
		}
		Expect(aclSecret.Data).To(HaveKey(managed.ACLFileKey), "the ACL Secret of master set %s/%s", ns, set.Name)
		if strings.Contains(string(aclSecret.Data[managed.ACLFileKey]), redlock.NoticeACLRules) {
			Expect(op.Publish(ctx, redlock.NoticeChannel("acl-probe"), "x").Err()).To(Succeed(), "a release notice, which the ACL file allows")
		} else {
			Expect(op.Publish(ctx, redlock.NoticeChannel("acl-probe"), "x").Err()).To(MatchError(ContainSubstring("NOPERM")), "a release notice, which the ACL file does not allow")
		}
		// The waiting lines' commands, likewise.
		line := redlock.LineKey("acl-probe")
		if strings.Contains(string(aclSecret.Data[managed.ACLFileKey]), redlock.LineACLRules) {
			Expect(op.ZAdd(ctx, line, redis.Z{Score: 1, Member: "probe|1"}).Err()).To(Succeed(), "a waiting line's ZADD, which the ACL file allows")
			Expect(op.Del(ctx, line).Err()).To(Succeed())
		} else {
			Expect(op.ZAdd(ctx, line, redis.Z{Score: 1, Member: "probe|1"}).Err()).To(MatchError(ContainSubstring("NOPERM")), "a waiting line's ZADD, which the ACL file does not allow")
		}
		for _, cmd := range [][]any{{"flushall"}, {"keys", "*"}, {"config", "get", "requirepass"}, {"acl", "list"}, {"shutdown"}, {"publish", "another-channel", "x"}} {
			Expect(op.Do(ctx, cmd...).Err()).To(MatchError(ContainSubstring("NOPERM")), "%v", cmd)
		}
	})
})
