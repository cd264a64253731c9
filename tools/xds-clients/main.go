// The real programs of vitals-xds's tests (services/xds/tests): gRPC upstreams, and grpc-go's
// own xDS client following vitals-xds, with no vitals code in either.
//
//	xds-clients upstreams PORT...        gRPC servers (the standard health service) on 127.0.0.1,
//	                                     "ready" once listening, until stdin closes
//	xds-clients client TARGET INTERVAL   a proxyless client dialling TARGET (xds:///POOL, with
//	                                     GRPC_XDS_BOOTSTRAP naming vitals-xds): one call every
//	                                     INTERVAL, a line per call "UNIX_MS PEER" or "UNIX_MS ERR
//	                                     CODE", until stdin closes
//	xds-clients envoy-config FILE        decode an Envoy bootstrap (YAML) strictly into Envoy's
//	                                     protos (unknown fields and types refused): "ok" or why
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and balancers
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: xds-clients upstreams PORT... | client TARGET INTERVAL | envoy-config FILE")
	}
	switch os.Args[1] {
	case "upstreams":
		upstreams(os.Args[2:])
	case "client":
		if len(os.Args) != 4 {
			fail("usage: xds-clients client TARGET INTERVAL")
		}
		interval, err := time.ParseDuration(os.Args[3])
		if err != nil {
			fail("interval: %v", err)
		}
		client(os.Args[2], interval)
	case "envoy-config":
		if len(os.Args) != 3 {
			fail("usage: xds-clients envoy-config FILE")
		}
		if err := checkEnvoyConfig(os.Args[2]); err != nil {
			fail("%s: %v", os.Args[2], err)
		}
		fmt.Println("ok")
	default:
		fail("unknown command %q", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// untilStdinCloses returns a channel closed when standard input ends (the test's way to stop us).
func untilStdinCloses() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		r := bufio.NewReader(os.Stdin)
		for {
			if _, err := r.ReadByte(); err != nil {
				close(done)
				return
			}
		}
	}()
	return done
}

func upstreams(ports []string) {
	for _, p := range ports {
		if _, err := strconv.Atoi(p); err != nil {
			fail("port %q: %v", p, err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:"+p)
		if err != nil {
			fail("listen %s: %v", p, err)
		}
		addr := lis.Addr().String()
		// Each answer names the upstream that gave it (header "upstream"), for clients that
		// cannot see their peer's address.
		s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs("upstream", addr))
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() { _ = s.Serve(lis) }()
	}
	fmt.Println("ready")
	<-untilStdinCloses()
}

func client(target string, interval time.Duration) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("dial %s: %v", target, err)
	}
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	done := untilStdinCloses()
	out := bufio.NewWriter(os.Stdout)
	var calls atomic.Int64
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			out.Flush()
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var p peer.Peer
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		now := time.Now().UnixMilli()
		if err != nil {
			fmt.Fprintf(out, "%d ERR %s\n", now, status.Code(err))
		} else {
			fmt.Fprintf(out, "%d %s\n", now, p.Addr)
		}
		if calls.Add(1)%10 == 0 {
			out.Flush()
		}
	}
}
