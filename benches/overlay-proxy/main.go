// overlay-proxy serves containerd's own overlayfs snapshotter (containerd v2.4.2, as
// its plugin configures it by default: asynchronous remove) as a proxy snapshotter over
// gRPC on a unix socket. The node-scale benchmark (benches/benches/containerd_scale.rs)
// runs it beside lamina so that both pay the same proxy hop: issue 23 measured its
// baseline this way.
//
//	overlay-proxy ROOT SOCKET
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"google.golang.org/grpc"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: overlay-proxy ROOT SOCKET")
		os.Exit(2)
	}
	root, socket := os.Args[1], os.Args[2]
	sn, err := overlay.NewSnapshotter(root, overlay.AsynchronousRemove)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlay-proxy: snapshotter at %s: %v\n", root, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(sn))
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlay-proxy: listening on %s: %v\n", socket, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.GracefulStop()
		_ = sn.Close()
	}()
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "overlay-proxy: %v\n", err)
		os.Exit(1)
	}
}
