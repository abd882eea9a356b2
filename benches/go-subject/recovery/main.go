// The client-go subject of recovery-bench: a SharedInformerFactory informer on
// the ConfigMaps of one namespace, with client-go's defaults, that prints
// every event its handler sees.
//
// Protocol (shared with benches/src/bin/subject_recovery.rs, described in
// benches/src/recovery.rs): one JSON line {"kind":"synced",...} once synced;
// then {"kind":"event","type":"add"|"update"|"delete","name":...,
// "resource_version":...,"at_ns":...} per event after the initial list (the
// initial adds are not printed), and {"kind":"watch_error",...} per error the
// reflector reports (after which client-go's default handler runs as usual).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// One writer at a time, so lines never interleave.
var out sync.Mutex

func emit(line map[string]interface{}) {
	text, _ := json.Marshal(line)
	out.Lock()
	defer out.Unlock()
	fmt.Println(string(text))
}

func event(kind string, obj interface{}, old interface{}) {
	at := time.Now().UnixNano()
	tombstone := false
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		tombstone = true
		obj = t.Obj
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		fmt.Fprintf(os.Stderr, "%s event for a %T\n", kind, obj)
		return
	}
	line := map[string]interface{}{
		"kind":             "event",
		"type":             kind,
		"name":             cm.Name,
		"resource_version": cm.ResourceVersion,
		"tombstone":        tombstone,
		"at_ns":            at,
	}
	if o, ok := old.(*corev1.ConfigMap); ok {
		line["old_resource_version"] = o.ResourceVersion
	}
	emit(line)
}

func main() {
	start := time.Now()
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, informers.WithNamespace(*namespace))
	informer := factory.Core().V1().ConfigMaps().Informer()
	err = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		emit(map[string]interface{}{
			"kind":    "watch_error",
			"gone":    apierrors.IsResourceExpired(err) || apierrors.IsGone(err),
			"message": err.Error(),
			"at_ns":   time.Now().UnixNano(),
		})
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if !isInInitialList {
				event("add", obj, nil)
			}
		},
		UpdateFunc: func(oldObj, newObj interface{}) { event("update", newObj, oldObj) },
		DeleteFunc: func(obj interface{}) { event("delete", obj, nil) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	// Poll every millisecond, as the Rust subject awaits its synced signal:
	// cache.WaitForCacheSync polls every 100 ms.
	for !informer.HasSynced() {
		time.Sleep(time.Millisecond)
	}
	emit(map[string]interface{}{
		"kind":      "synced",
		"subject":   "client-go",
		"synced_ms": float64(time.Since(start).Microseconds()) / 1000,
		"cached":    len(informer.GetStore().ListKeys()),
		"at_ns":     time.Now().UnixNano(),
	})
	// Run until the driver closes stdin (or kills the process).
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	close(stop)
}
