// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain),
// built from the version go.mod pins, so that tests and development run a
// real external etcd without a package manager: make tools builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
