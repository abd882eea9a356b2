// The client-go subject of the informer benchmark: a SharedIndexInformer on
// the Pods of one namespace that counts events and keeps the cache.
//
// Protocol (shared with the Rust subjects in benches/src/bin): print one JSON
// line when synced with --expect objects cached; then, with --updates M, one
// more line once M update events carrying the label bench-update were seen,
// with the wall-clock time (Unix ns) each one reached the handler; with
// --reads R, once the driver writes a line to stdin (when the CPUs are idle
// again), one more line with the times of R gets by random key, of full lists
// and of by-index reads (the informer indexes the Pods by their bench-group
// label); with --reconciles M, once the driver writes another line, the
// reconcile case: the update handler queues the key of each Pod whose
// bench-reconcile label changed on a client-go workqueue, one worker
// reconciles each key as a ReplicaSet controller reads its cache (the Pod by
// key through the generated PodLister, then its group by label selector), and
// once the M changes are seen and reconciled it prints one more line; with
// --relist V, one more line once the handler saw a Pod's bench-relist label
// set to V (set while the subject is cut off).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

const (
	updateLabel    = "bench-update"
	groupLabel     = "bench-group"
	groupSize      = 100
	relistLabel    = "bench-relist"
	reconcileLabel = "bench-reconcile"
)

// xorShift draws the same random keys as the Rust subjects (benches/src/lib.rs).
type xorShift uint64

func (x *xorShift) below(n int) int {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return int(uint64(*x) % uint64(max(n, 1)))
}

func median(values []float64) float64 {
	slices.Sort(values)
	n := len(values)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return values[n/2]
	default:
		return (values[n/2-1] + values[n/2]) / 2
	}
}

// percentile is the nearest-rank percentile p (0 to 1) of sorted values, as
// benches::percentile.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	r := int(p*float64(len(sorted)) + 0.999999999)
	return sorted[min(max(r, 1), len(sorted))-1]
}

// reconcileQueue is the reconcile case's side of the update handler: the
// controller's workqueue of Pod keys. It shuts down once the handler saw the
// expected changes, so the worker stops when it has reconciled the last key.
type reconcileQueue struct {
	queue    *workqueue.Typed[string]
	expected int
	events   atomic.Int64
	// When the handler saw the first change, Unix ns.
	first atomic.Int64
}

// onUpdate queues the key of newPod if the update changed its bench-reconcile
// label, as a controller's handler filters the updates it acts on.
func (r *reconcileQueue) onUpdate(oldPod, newPod *corev1.Pod) {
	value, ok := newPod.Labels[reconcileLabel]
	if !ok || oldPod.Labels[reconcileLabel] == value {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(newPod)
	if err != nil {
		return
	}
	r.first.CompareAndSwap(0, time.Now().UnixNano())
	r.queue.Add(key)
	if r.events.Add(1) == int64(r.expected) {
		r.queue.ShutDown()
	}
}

// work runs the worker: it reconciles each key until the queue is shut down
// and empty, then returns the reconcile line.
func (r *reconcileQueue) work(lister corelisters.PodLister, n int) (map[string]interface{}, error) {
	reads := make([]float64, 0, r.expected)
	lastEnd := time.Now()
	for {
		key, shutdown := r.queue.Get()
		if shutdown {
			break
		}
		started := time.Now()
		group, length, err := reconcileReads(lister, key)
		lastEnd = time.Now()
		reads = append(reads, float64(lastEnd.Sub(started).Nanoseconds()))
		r.queue.Done(key)
		if err != nil {
			return nil, err
		}
		if expected := groupLen(n, group); expected != length {
			return nil, fmt.Errorf("listing %s=%s returned %d Pods, expected %d", groupLabel, group, length, expected)
		}
	}
	rss, hwm := status()
	slices.Sort(reads)
	total := 0.0
	for _, ns := range reads {
		total += ns
	}
	events := r.events.Load()
	wall := float64(lastEnd.UnixNano()-r.first.Load()) / 1e9
	return map[string]interface{}{
		"subject":         "client-go",
		"events":          events,
		"reconciles":      len(reads),
		"per_second":      float64(len(reads)) / (total / 1e9),
		"wall_per_second": float64(events) / wall,
		"read_p50_us":     percentile(reads, 0.50) / 1e3,
		"read_p99_us":     percentile(reads, 0.99) / 1e3,
		"rss_kb":          rss,
		"hwm_kb":          hwm,
	}, nil
}

// reconcileReads is a ReplicaSet-style reconcile's reads of the cache: the Pod
// under key, then every Pod of its group by label selector. It returns the
// group and how many Pods the list returned.
func reconcileReads(lister corelisters.PodLister, key string) (string, int, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return "", 0, err
	}
	pod, err := lister.Pods(namespace).Get(name)
	if err != nil {
		return "", 0, err
	}
	group, ok := pod.Labels[groupLabel]
	if !ok {
		return "", 0, fmt.Errorf("%s has no %s label", key, groupLabel)
	}
	pods, err := lister.List(labels.SelectorFromSet(labels.Set{groupLabel: group}))
	if err != nil {
		return "", 0, err
	}
	return group, len(pods), nil
}

// groupLen is how many of n Pods carry the bench-group value group (as
// benches::group_len); -1 for a value no Pod has.
func groupLen(n int, group string) int {
	g, err := strconv.Atoi(strings.TrimPrefix(group, "g"))
	if err != nil || !strings.HasPrefix(group, "g") || g < 0 || g*groupSize >= n {
		return -1
	}
	return min(groupSize, n-g*groupSize)
}

// timeReads times reads of the informer's cache of n Pods and returns the
// reads line (the same reads as benches::time_reads).
func timeReads(indexer cache.Indexer, namespace string, n, samples int) (map[string]interface{}, error) {
	random := xorShift(0x9e3779b97f4a7c15)
	keys := make([]string, samples)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/nginx-%05d", namespace, random.below(n))
	}
	// Untimed gets of other random keys first, as many: the timed ones then meet
	// warm code and caches rather than a process just woken from idle.
	warm := xorShift(0x2545f4914f6cdd1d)
	for range samples {
		_, _, _ = indexer.GetByKey(fmt.Sprintf("%s/nginx-%05d", namespace, warm.below(n)))
	}
	gets := make([]float64, 0, samples)
	for _, key := range keys {
		started := time.Now()
		_, found, err := indexer.GetByKey(key)
		gets = append(gets, float64(time.Since(started).Nanoseconds()))
		if err != nil || !found {
			return nil, fmt.Errorf("get %s found nothing (%v)", key, err)
		}
	}
	slices.Sort(gets)
	lists := make([]float64, 0, 7)
	for range 7 {
		started := time.Now()
		l := len(indexer.List())
		lists = append(lists, float64(time.Since(started).Nanoseconds())/1e6)
		if l != n {
			return nil, fmt.Errorf("a list returned %d objects, expected %d", l, n)
		}
	}
	full := max(n/groupSize, 1)
	byIndex := make([]float64, 0, 200)
	length := 0
	for range 200 {
		group := fmt.Sprintf("g%d", random.below(full))
		started := time.Now()
		objects, err := indexer.ByIndex(groupLabel, group)
		byIndex = append(byIndex, float64(time.Since(started).Nanoseconds())/1e3)
		if err != nil {
			return nil, err
		}
		length = len(objects)
	}
	return map[string]interface{}{
		"subject":      "client-go",
		"get_samples":  samples,
		"get_p50_ns":   percentile(gets, 0.50),
		"get_p99_ns":   percentile(gets, 0.99),
		"list_ms":      median(lists),
		"by_index_us":  median(byIndex),
		"by_index_len": length,
	}, nil
}

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
	reads := flag.Int("reads", 0, "after the updates, time this many gets by random key, lists and by-index reads (0 skips)")
	reconciles := flag.Int("reconciles", 0, "after the reads and the driver's next go-ahead, reconcile each change of a Pod's bench-reconcile label until this many were seen (0 skips)")
	relist := flag.String("relist", "", "then wait until the handler sees a Pod whose bench-relist label has this value")
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
	podLister := factory.Core().V1().Pods().Lister()
	var reconcile *reconcileQueue
	if *reconciles > 0 {
		reconcile = &reconcileQueue{queue: workqueue.NewTyped[string](), expected: *reconciles}
	}
	err = informer.AddIndexers(cache.Indexers{groupLabel: func(obj interface{}) ([]string, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		if group, ok := pod.Labels[groupLabel]; ok {
			return []string{group}, nil
		}
		return nil, nil
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	var mu sync.Mutex
	var adds, updatesSeen, deletes int
	received := make(map[string]int64, *updates)
	done := make(chan struct{})
	// Updates whose old and new resourceVersion are the same: a relist replays every
	// object it already had as one.
	replays := 0
	relistSeen := make(chan int, 1)
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
			if old, isPod := oldObj.(*corev1.Pod); isPod && reconcile != nil {
				reconcile.onUpdate(old, pod)
			}
			id, ok := pod.Labels[updateLabel]
			mu.Lock()
			defer mu.Unlock()
			updatesSeen++
			if old, isPod := oldObj.(*corev1.Pod); isPod && old.ResourceVersion == pod.ResourceVersion {
				replays++
			}
			if *relist != "" && pod.Labels[relistLabel] == *relist {
				select {
				case relistSeen <- replays:
				default:
				}
			}
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
	stdin := bufio.NewReader(os.Stdin)
	if *reads > 0 {
		if _, err := stdin.ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "client-go: stdin closed before the driver's go-ahead to read:", err)
			os.Exit(1)
		}
		line, err := timeReads(informer.GetIndexer(), *namespace, *expect, *reads)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(line)
		fmt.Println(string(out))
	}
	if reconcile != nil {
		if _, err := stdin.ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "client-go: stdin closed before the driver's go-ahead to reconcile:", err)
			os.Exit(1)
		}
		// The peak from here on is the reconciles'.
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			fmt.Fprintln(os.Stderr, "client-go: resetting the peak RSS:", err)
			os.Exit(1)
		}
		line, err := reconcile.work(podLister, *expect)
		if err != nil {
			fmt.Fprintln(os.Stderr, "client-go:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(line)
		fmt.Println(string(out))
	}
	if *relist != "" {
		// The marker is on the Pod a list delivers last, so by then a relist has replayed
		// every other object to this handler.
		replayed := <-relistSeen
		line, _ = json.Marshal(map[string]interface{}{
			"subject":  "client-go",
			"relisted": replayed > 0,
			"cached":   len(informer.GetStore().ListKeys()),
			"at_ns":    time.Now().UnixNano(),
		})
		fmt.Println(string(line))
	}
	// Stay up (the driver reads RSS and then kills the process) until stdin closes.
	_, _ = stdin.ReadString('\n')
	close(stop)
}
