package main

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// embeddedEtcd is a single-member etcd living in the `kcluster up` process itself.
type embeddedEtcd struct{ server *embed.Etcd }

// startEtcd starts etcd with fsync off: the data is thrown away after each test session,
// and fsync on every write costs the API server tens of milliseconds on a small disk.
func startEtcd(dataDir string, clientPort, peerPort int) (*embeddedEtcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "weightcache-test"
	cfg.Dir = dataDir
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	clientURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	peerURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*clientURL}, []url.URL{*clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peerURL}, []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-server.Server.ReadyNotify():
		return &embeddedEtcd{server: server}, nil
	case <-time.After(30 * time.Second):
		server.Close()
		return nil, fmt.Errorf("not ready after 30s")
	}
}

func (e *embeddedEtcd) Err() <-chan error { return e.server.Err() }

func (e *embeddedEtcd) Close() { e.server.Close() }
