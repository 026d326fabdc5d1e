package operator

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// WebhookOptions configures the mutating webhook that gates labelled pods
// and the in-process management of its serving certificate.
type WebhookOptions struct {
	// Namespace of the operator: the Service and the certificate Secret.
	Namespace string
	// ServiceName is the webhook's Service; the certificate is issued for
	// <service>.<namespace>.svc.
	ServiceName string
	// ExtraDNSNames are further names in the certificate (e.g. localhost
	// for a webhook reached on the host network).
	ExtraDNSNames []string
	// SecretName holds the CA and the serving certificate.
	SecretName string
	// ConfigurationName is the MutatingWebhookConfiguration whose CA
	// bundle is kept current.
	ConfigurationName string
	// CertDir is where the webhook server reads the certificate (the
	// manager's WebhookServer must use the same directory).
	CertDir string
	// WatchNamespaces are the namespaces the operator watches (empty: all):
	// pods of any other namespace are not gated.
	WatchNamespaces []string
	// AgentImage is the operator's image, which pods that ask for the
	// in-pod agent copy it from.
	AgentImage string
}

// The rotator caches the Secrets of the operator's namespace (it lists and
// watches them all) and rewrites only the certificate's; it caches every
// MutatingWebhookConfiguration and rewrites only the operator's (a
// ClusterRole of its own, which --enable-webhook=false does without). The
// names are the defaults of --webhook-secret-name and
// --webhook-configuration-name: a manager given others needs its rules
// edited.
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=secrets,verbs=list;watch
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=secrets,verbs=update,resourceNames=redlock-operator-webhook-server-cert
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=list;watch,roleName=webhook-ca-role
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=update,resourceNames=redlock-operator-mutating-webhook-configuration,roleName=webhook-ca-role

// SetupWebhook runs cert-controller's rotator, which issues a CA and a
// serving certificate into a Secret, writes them to CertDir, keeps the
// webhook configuration's CA bundle current and rotates both before they
// expire; once the certificate is in place it registers the webhook on the
// manager's webhook server (which starts then).
func SetupWebhook(ctx context.Context, mgr manager.Manager, o WebhookOptions) error {
	ready, err := addRotator(ctx, mgr, certificate{
		Namespace: o.Namespace, SecretName: o.SecretName, CertDir: o.CertDir,
		DNSName: fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace), ExtraDNSNames: o.ExtraDNSNames,
		Webhooks: []rotator.WebhookInfo{{Name: o.ConfigurationName, Type: rotator.Mutating}},
	})
	if err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	go func() {
		<-ready
		mgr.GetWebhookServer().Register(podgate.WebhookPath, &webhook.Admission{Handler: &podgate.Gater{
			Decoder: admission.NewDecoder(mgr.GetScheme()), Namespaces: o.WatchNamespaces, Agent: podagent.Options{Image: o.AgentImage}, Locks: mgr.GetClient(),
		}})
	}()
	return nil
}

// certificate is a serving certificate the operator issues and rotates.
type certificate struct {
	// Namespace and SecretName: the Secret that keeps the CA and the
	// certificate (ca.crt, tls.crt, tls.key).
	Namespace, SecretName string
	// CertDir is where the Secret is mounted.
	CertDir string
	// DNSName and ExtraDNSNames are the names the certificate is for.
	DNSName       string
	ExtraDNSNames []string
	// Webhooks whose CA bundle is kept current.
	Webhooks []rotator.WebhookInfo
	// Controller is the rotator's controller name, unique in the manager
	// ("" is cert-controller's default, cert-rotator).
	Controller string
}

// addRotator runs cert-controller's rotator for c, creating its empty
// Secret first when it is missing. The channel closes once the
// certificate is mounted in c.CertDir.
func addRotator(ctx context.Context, mgr manager.Manager, c certificate) (<-chan struct{}, error) {
	if err := ensureSecret(ctx, mgr, types.NamespacedName{Namespace: c.Namespace, Name: c.SecretName}); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: c.Namespace, Name: c.SecretName},
		CertDir:        c.CertDir,
		CAName:         "redlock-operator-ca",
		CAOrganization: "redlock-operator",
		DNSName:        c.DNSName,
		ExtraDNSNames:  c.ExtraDNSNames,
		IsReady:        ready,
		Webhooks:       c.Webhooks,
		ControllerName: c.Controller,
		// Every replica serves, leader or not.
		RequireLeaderElection: false,
	})
	if err != nil {
		return nil, fmt.Errorf("certificate rotator of secret %s: %w", c.SecretName, err)
	}
	return ready, nil
}

// ensureSecret creates the (empty) certificate Secret when it is missing:
// the rotator fills it but does not create it, and a manager installed
// without it would otherwise stop at once.
func ensureSecret(ctx context.Context, mgr manager.Manager, key types.NamespacedName) error {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{"app.kubernetes.io/name": "redlock-operator"}}}
	if err := c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("certificate secret %s: %w", key, err)
	}
	return nil
}
