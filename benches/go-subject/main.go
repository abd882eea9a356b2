// The client-go subject of the informer benchmark: a SharedIndexInformer on
// the Pods of one namespace that counts events and keeps the cache.
//
// Protocol (shared with the Rust subjects in benches/src/bin): print one JSON
// line when synced with --expect objects cached; then, with --updates M, one
// more line once M update events carrying the label bench-update were seen,
// with the wall-clock time (Unix ns) each one reached the handler.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const updateLabel = "bench-update"

func status() (rss, hwm int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}

func main() {
	start := time.Now()
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch")
	expect := flag.Int("expect", 0, "objects to cache before reporting synced")
	updates := flag.Int("updates", 0, "update events to wait for after sync")
	jsonOnly := flag.Bool("json", false, "talk JSON only (client-go prefers protobuf for built-in types)")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *jsonOnly {
		config.ContentType = "application/json"
		config.AcceptContentTypes = "application/json"
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, informers.WithNamespace(*namespace))
	informer := factory.Core().V1().Pods().Informer()

	var mu sync.Mutex
	var adds, updatesSeen, deletes int
	received := make(map[string]int64, *updates)
	done := make(chan struct{})
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			mu.Lock()
			adds++
			mu.Unlock()
		},
		UpdateFunc: func(oldObj, newObj interface{}) {
			now := time.Now().UnixNano()
			pod, ok := newObj.(*corev1.Pod)
			if !ok {
				return
			}
			id, ok := pod.Labels[updateLabel]
			mu.Lock()
			defer mu.Unlock()
			updatesSeen++
			if !ok || *updates == 0 {
				return
			}
			if _, seen := received[id]; seen {
				return
			}
			received[id] = now
			if len(received) == *updates {
				close(done)
			}
		},
		DeleteFunc: func(obj interface{}) {
			mu.Lock()
			deletes++
			mu.Unlock()
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	// Poll every millisecond, as the Rust subjects do: cache.WaitForCacheSync polls
	// every 100 ms, which would add up to 100 ms to the measured sync time.
	for !informer.HasSynced() {
		time.Sleep(time.Millisecond)
	}
	for len(informer.GetStore().ListKeys()) < *expect {
		time.Sleep(time.Millisecond)
	}
	syncedMs := float64(time.Since(start).Microseconds()) / 1000
	rss, hwm := status()
	mu.Lock()
	line, _ := json.Marshal(map[string]interface{}{
		"subject":   "client-go",
		"synced_ms": syncedMs,
		"rss_kb":    rss,
		"hwm_kb":    hwm,
		"cached":    len(informer.GetStore().ListKeys()),
		"adds":      adds,
	})
	mu.Unlock()
	fmt.Println(string(line))

	if *updates > 0 {
		<-done
		mu.Lock()
		line, _ = json.Marshal(map[string]interface{}{
			"subject":  "client-go",
			"updates":  len(received),
			"received": received,
		})
		mu.Unlock()
		fmt.Println(string(line))
	}
	// Stay up (the driver reads RSS and then kills the process) until stdin closes.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	close(stop)
}
