package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the set of files a fresh cluster needs: one CA signs the API server's serving
// certificate and the admin's client certificate; a separate key pair signs and verifies
// ServiceAccount tokens (the TokenRequest API and the legacy token controller).
type pki struct {
	CACert, ServingCert, ServingKey, AdminCert, AdminKey, ServiceAccountKey, ServiceAccountPub string
	// KubeletCert/Key serve the process kubelet's log endpoint, which the API server calls
	// for `kubectl logs`; the API server does not verify kubelet certificates here.
	KubeletCert, KubeletKey string
}

func newPKI(dir string, address net.IP) (*pki, error) {
	p := &pki{
		CACert:            filepath.Join(dir, "ca.crt"),
		ServingCert:       filepath.Join(dir, "apiserver.crt"),
		ServingKey:        filepath.Join(dir, "apiserver.key"),
		AdminCert:         filepath.Join(dir, "admin.crt"),
		AdminKey:          filepath.Join(dir, "admin.key"),
		ServiceAccountKey: filepath.Join(dir, "sa.key"),
		ServiceAccountPub: filepath.Join(dir, "sa.pub"),
		KubeletCert:       filepath.Join(dir, "kubelet.crt"),
		KubeletKey:        filepath.Join(dir, "kubelet.key"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := certificateTemplate("weightcache-test-ca")
	caTemplate.IsCA = true
	caTemplate.BasicConstraintsValid = true
	caTemplate.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if err := writePEM(p.CACert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}

	serving := certificateTemplate("kube-apiserver")
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	// Pods reach the API server on its address (in-cluster config) and clients may use the
	// Service names or the first Service IP, so all of them must verify.
	serving.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), address, net.ParseIP(serviceIP)}
	serving.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if err := signLeaf(p.ServingCert, p.ServingKey, serving, caCert, caKey); err != nil {
		return nil, err
	}

	admin := certificateTemplate("kubernetes-admin")
	admin.Subject.Organization = []string{"system:masters"}
	admin.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if err := signLeaf(p.AdminCert, p.AdminKey, admin, caCert, caKey); err != nil {
		return nil, err
	}

	kubelet := certificateTemplate("process-kubelet")
	kubelet.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	kubelet.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	if err := signLeaf(p.KubeletCert, p.KubeletKey, kubelet, caCert, caKey); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.ServiceAccountKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	return p, writePEM(p.ServiceAccountPub, "PUBLIC KEY", pub)
}

func certificateTemplate(commonName string) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
}

func signLeaf(certPath, keyPath string, template, ca *x509.Certificate, caKey crypto.Signer) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
