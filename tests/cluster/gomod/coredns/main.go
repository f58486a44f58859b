// Command coredns is CoreDNS v1.15.0 with only the plugins the local cluster's DNS uses.
//
// Why not upstream's main package: it links all 60-odd plugins (cloud DNS providers, etcd,
// dnstap, ...), which multiplies the cold build on a 2-core machine; the Corefile written by
// tests/cluster/dns.py needs only these. The plugin order is upstream's own (dnsserver.Directives).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
