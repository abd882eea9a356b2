// The client-go subject of fleet-bench: what a Go user writes today for a
// controller over many clusters without a fleet library.
//
// One informers.SharedInformerFactory per cluster (client-go's defaults, no
// resync) with an informer on the cluster's ConfigMaps (the whole cluster for
// a real cluster, informers.WithNamespace for a namespace-cluster), whose
// handler adds the key "cluster/namespace/name" to ONE rate-limited workqueue
// shared by every cluster (workqueue.DefaultTypedControllerRateLimiter), and
// --workers goroutines in total taking keys from it. A reconcile reads the
// object through the cluster's lister, sleeps the milliseconds of its
// fleet-bench/cost-ms annotation (none for the initial objects), and records
// the time.
//
// Clusters come from either a directory of kubeconfig files (--setup real:
// read at start and again every 2 s, as kube-informer's KubeconfigDirectory
// does; hidden files are skipped, a file names its cluster without its
// extension; files that change or go are not followed) or the namespaces of
// one API server carrying a label (--setup namespaces: an informer on those
// Namespaces starts a namespaced factory for each as it appears).
//
// Protocol (the same as benches/src/bin/subject_fleet.rs, described in
// benches/src/fleet_lines.rs): JSON lines on stdout, {"event":"ready"} once
// running with no cluster, then "engaged", "first", "synced", "sample" and
// "flood_done" lines. It runs until stdin closes.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

const (
	initialPrefix  = "cm-"
	floodPrefix    = "flood-"
	samplePrefix   = "sample-"
	costAnnotation = "fleet-bench/cost-ms"
)

// One writer at a time, so lines never interleave.
var out sync.Mutex

func emit(line map[string]interface{}) {
	text, err := json.Marshal(line)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client-go: a line did not serialise:", err)
		return
	}
	out.Lock()
	defer out.Unlock()
	fmt.Println(string(text))
}

// seen is what one cluster's reconciles have seen.
type seen struct {
	first   bool
	initial map[string]struct{}
	synced  bool
	floods  map[string]map[string]struct{}
	samples map[string]struct{}
}

// recorder keeps every cluster's reconciles and prints the lines.
type recorder struct {
	objects  int
	flood    int
	mu       sync.Mutex
	clusters map[string]*seen
}

func (r *recorder) reconciled(cluster, name string) {
	at := time.Now().UnixNano()
	var lines []map[string]interface{}
	r.mu.Lock()
	s, ok := r.clusters[cluster]
	if !ok {
		s = &seen{
			initial: map[string]struct{}{},
			floods:  map[string]map[string]struct{}{},
			samples: map[string]struct{}{},
		}
		r.clusters[cluster] = s
	}
	if !s.first {
		s.first = true
		lines = append(lines, map[string]interface{}{"event": "first", "cluster": cluster, "name": name, "at_ns": at})
	}
	switch {
	case strings.HasPrefix(name, initialPrefix):
		if _, dup := s.initial[name]; !s.synced && !dup {
			s.initial[name] = struct{}{}
			if len(s.initial) >= r.objects {
				s.synced = true
				lines = append(lines, map[string]interface{}{"event": "synced", "cluster": cluster, "objects": len(s.initial), "at_ns": at})
				s.initial = map[string]struct{}{}
			}
		}
	case strings.HasPrefix(name, floodPrefix):
		rest := strings.TrimPrefix(name, floodPrefix)
		phase := rest
		if i := strings.LastIndex(rest, "-"); i >= 0 {
			phase = rest[:i]
		}
		flood, ok := s.floods[phase]
		if !ok {
			flood = map[string]struct{}{}
			s.floods[phase] = flood
		}
		if _, dup := flood[name]; !dup {
			flood[name] = struct{}{}
			if len(flood) == r.flood {
				lines = append(lines, map[string]interface{}{"event": "flood_done", "cluster": cluster, "phase": phase, "reconciled": len(flood), "at_ns": at})
			}
		}
	case strings.HasPrefix(name, samplePrefix):
		if _, dup := s.samples[name]; !dup {
			s.samples[name] = struct{}{}
			lines = append(lines, map[string]interface{}{"event": "sample", "cluster": cluster, "name": name, "at_ns": at})
		}
	}
	r.mu.Unlock()
	for _, line := range lines {
		emit(line)
	}
}

// fleet is the clusters engaged, their listers, and the one shared queue.
type fleet struct {
	queue    workqueue.TypedRateLimitingInterface[string]
	rec      *recorder
	mu       sync.RWMutex
	listers  map[string]corelisters.ConfigMapLister
	stop     chan struct{}
	engaging sync.Mutex
}

// engage starts a factory for cluster (only namespace, if not empty) whose
// ConfigMap informer feeds the shared queue. Called once per cluster.
func (f *fleet) engage(cluster string, clientset kubernetes.Interface, namespace string) {
	var options []informers.SharedInformerOption
	if namespace != "" {
		options = append(options, informers.WithNamespace(namespace))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, options...)
	configMaps := factory.Core().V1().ConfigMaps()
	enqueue := func(obj interface{}) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go: no key:", err)
			return
		}
		f.queue.Add(cluster + "/" + key)
	}
	_, err := configMaps.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client-go: adding the handler:", err)
		return
	}
	f.mu.Lock()
	f.listers[cluster] = configMaps.Lister()
	f.mu.Unlock()
	emit(map[string]interface{}{"event": "engaged", "cluster": cluster, "at_ns": time.Now().UnixNano()})
	factory.Start(f.stop)
}

// work takes keys from the shared queue until it shuts down.
func (f *fleet) work() {
	for {
		key, shutdown := f.queue.Get()
		if shutdown {
			return
		}
		f.reconcile(key)
		f.queue.Forget(key)
		f.queue.Done(key)
	}
}

func (f *fleet) reconcile(key string) {
	cluster, objectKey, ok := strings.Cut(key, "/")
	if !ok {
		fmt.Fprintln(os.Stderr, "client-go: a key without a cluster:", key)
		return
	}
	namespace, name, err := cache.SplitMetaNamespaceKey(objectKey)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client-go:", err)
		return
	}
	f.mu.RLock()
	lister := f.listers[cluster]
	f.mu.RUnlock()
	if lister == nil {
		fmt.Fprintln(os.Stderr, "client-go: no lister for cluster", cluster)
		return
	}
	if cm, err := lister.ConfigMaps(namespace).Get(name); err == nil {
		if ms, err := strconv.Atoi(cm.Annotations[costAnnotation]); err == nil && ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
	}
	f.rec.reconciled(cluster, name)
}

// clusterName is a file's cluster: its name without a kubeconfig extension,
// as KubeconfigDirectory names it.
func clusterName(file string) string {
	for _, ext := range []string{".yaml", ".yml", ".json", ".kubeconfig", ".conf"} {
		if stem := strings.TrimSuffix(file, ext); stem != file && stem != "" {
			return stem
		}
	}
	return file
}

// followDirectory reads dir now and every 2 s after, engaging each new file's
// cluster.
func (f *fleet) followDirectory(dir string) {
	known := map[string]bool{}
	for {
		entries, err := os.ReadDir(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go: reading", dir, ":", err)
		}
		for _, entry := range entries {
			file := entry.Name()
			if strings.HasPrefix(file, ".") {
				continue
			}
			path := filepath.Join(dir, file)
			if info, err := os.Stat(path); err != nil || !info.Mode().IsRegular() {
				continue
			}
			cluster := clusterName(file)
			if known[cluster] {
				continue
			}
			config, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				fmt.Fprintln(os.Stderr, "client-go: kubeconfig", path, ":", err)
				continue
			}
			clientset, err := kubernetes.NewForConfig(config)
			if err != nil {
				fmt.Fprintln(os.Stderr, "client-go: client for", path, ":", err)
				continue
			}
			known[cluster] = true
			f.engage(cluster, clientset, "")
		}
		time.Sleep(2 * time.Second)
	}
}

// followNamespaces engages each namespace selected by selector as it appears.
func (f *fleet) followNamespaces(clientset kubernetes.Interface, selector string) error {
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0,
		informers.WithTweakListOptions(func(options *metav1.ListOptions) {
			options.LabelSelector = selector
		}))
	_, err := factory.Core().V1().Namespaces().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			namespace, ok := obj.(*corev1.Namespace)
			if !ok {
				return
			}
			f.engaging.Lock()
			defer f.engaging.Unlock()
			f.mu.RLock()
			_, known := f.listers[namespace.Name]
			f.mu.RUnlock()
			if !known {
				f.engage(namespace.Name, clientset, namespace.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	factory.Start(f.stop)
	return nil
}

func main() {
	setup := flag.String("setup", "", "real (a directory of kubeconfig files) or namespaces (labelled namespaces of one API server)")
	dir := flag.String("dir", "", "the directory of kubeconfig files (--setup real)")
	kubeconfig := flag.String("kubeconfig", "", "the API server whose namespaces are the clusters (--setup namespaces)")
	selector := flag.String("selector", "fleet-bench/member=yes", "the label selector of the namespaces that are clusters")
	workers := flag.Int("workers", 4, "workers in total, on the one shared queue")
	objects := flag.Int("objects", 0, "initial objects per cluster: synced once this many are reconciled")
	flood := flag.Int("flood", 0, "objects per flood: flood_done once a cluster has reconciled this many of one")
	flag.Parse()
	if *workers < 1 || *objects < 1 {
		fmt.Fprintln(os.Stderr, "client-go: --workers and --objects must be at least 1")
		os.Exit(2)
	}

	f := &fleet{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "fleet-bench"},
		),
		rec:     &recorder{objects: *objects, flood: *flood, clusters: map[string]*seen{}},
		listers: map[string]corelisters.ConfigMapLister{},
		stop:    make(chan struct{}),
	}
	for range *workers {
		go f.work()
	}
	switch *setup {
	case "real":
		if info, err := os.Stat(*dir); err != nil || !info.IsDir() {
			fmt.Fprintf(os.Stderr, "client-go: --dir %q is not a directory (%v)\n", *dir, err)
			os.Exit(2)
		}
		go f.followDirectory(*dir)
	case "namespaces":
		config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go:", err)
			os.Exit(2)
		}
		clientset, err := kubernetes.NewForConfig(config)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go:", err)
			os.Exit(2)
		}
		if err := f.followNamespaces(clientset, *selector); err != nil {
			fmt.Fprintln(os.Stderr, "client-go:", err)
			os.Exit(2)
		}
	default:
		fmt.Fprintf(os.Stderr, "client-go: --setup must be real or namespaces, not %q\n", *setup)
		os.Exit(2)
	}
	emit(map[string]interface{}{
		"event":   "ready",
		"subject": "client-go",
		"workers": fmt.Sprintf("one rate-limited workqueue shared by every cluster (keys cluster/namespace/name), %d workers", *workers),
		"at_ns":   time.Now().UnixNano(),
	})
	// Stay up until stdin closes.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	close(f.stop)
	f.queue.ShutDown()
}
