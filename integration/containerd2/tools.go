//go:build tools

// Package tools pins what lamina's tests run against containerd 2.x: containerd, its
// runc shim and ctr, runc 1.5 and crictl. scripts/containerd2 builds each command from
// this module, so go.sum fixes every byte that goes into them.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
