// Command podresources-list asks the pod resources API on the socket it is given for its List
// and prints the answer as JSON, through the client Kubernetes ships for monitoring agents.
// hack/kubernetes.sh builds it inside Debian's kubernetes source tree, against that tree's
// client and generated API.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: podresources-list SOCKET")
		os.Exit(2)
	}
	client, conn, err := podresources.GetV1Client("unix://"+os.Args[1], 10*time.Second, 16*1024*1024)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := json.Marshal(resp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
