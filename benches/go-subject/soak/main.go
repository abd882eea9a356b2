// The client-go subject of the soak run: informers on all Pods (typed) and on
// a CRD (dynamic, unstructured), each with a fast, a slow and (on request) a
// late handler, that append every event they see to a file. The driver injects
// faults between this process and the API server, then checks each recorded
// event against the server's history, so a record must say exactly what the
// handler was given.
//
// Protocol (shared with the Rust soak driver): stdout carries JSON lines
// {"kind":"synced"} once both informers have synced, {"kind":"late_added"}
// after the driver's "late" line on stdin, {"kind":"watch_error"} per error a
// reflector reports (after which client-go's default handler runs as usual),
// and {"kind":"done","events":N} at exit. Events go to --events, one JSON
// object per line. Closing stdin (or SIGTERM) stops the subject.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const markerAnnotation = "soak.kube-informer.dev/write"

// How long to wait for the informers (and so their handlers) to stop before
// giving up on them: a handler stuck past this must not keep the driver
// waiting forever, and anything it records later is dropped, not half-written.
const shutdownGrace = 10 * time.Second

// One writer at a time, so stdout lines never interleave.
var out sync.Mutex

func emit(line map[string]interface{}) {
	text, _ := json.Marshal(line)
	out.Lock()
	defer out.Unlock()
	fmt.Println(string(text))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// The field order is the one the driver's checker documents; keep it.
type record struct {
	Subject   string `json:"subject"`
	Handler   string `json:"handler"`
	Resource  string `json:"resource"`
	Type      string `json:"type"`
	Key       string `json:"key"`
	RV        string `json:"rv"`
	Marker    string `json:"marker"`
	Initial   bool   `json:"initial"`
	Resync    bool   `json:"resync"`
	Tombstone bool   `json:"tombstone"`
	Deleting  bool   `json:"deleting"`
	AtNs      int64  `json:"at_ns"`
}

// All handlers of both informers share one buffered writer, so records are
// whole lines in the order they were taken; the mutex is the only ordering.
type recorder struct {
	mu      sync.Mutex
	w       *bufio.Writer
	f       *os.File
	written int64
	closed  bool
	err     error
}

func (r *recorder) write(rec record) {
	line, err := json.Marshal(rec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "marshal:", err)
		return
	}
	line = append(line, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	// After the final flush nothing may be added: "done" reports a count the
	// driver compares with the file's lines.
	if r.closed || r.err != nil {
		return
	}
	if _, err := r.w.Write(line); err != nil {
		r.fail(err)
		return
	}
	r.written++
}

func (r *recorder) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.err != nil {
		return
	}
	if err := r.w.Flush(); err != nil {
		r.fail(err)
	}
}

// The error is kept rather than fatal at once: the subject still shuts down
// in order, but exits non-zero so lost records are not blamed on client-go.
func (r *recorder) fail(err error) {
	r.err = err
	fmt.Fprintln(os.Stderr, "events file:", err)
}

func (r *recorder) close() (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed && r.err == nil {
		if err := r.w.Flush(); err != nil {
			r.fail(err)
		}
	}
	r.closed = true
	if err := r.f.Close(); err != nil && r.err == nil {
		r.fail(err)
	}
	return r.written, r.err
}

// What a handler needs to know about an object; the same accessors work for
// typed Pods and unstructured widgets.
func describe(obj interface{}) (key, rv, marker string, deleting bool, err error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", "", "", false, err
	}
	key, err = cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", "", "", false, err
	}
	return key, m.GetResourceVersion(), m.GetAnnotations()[markerAnnotation], m.GetDeletionTimestamp() != nil, nil
}

// handlerFor builds one named handler on one resource. delay is paid before
// recording each event, so a slow handler's records lag (and its queue grows)
// the way a real slow consumer's would.
func handlerFor(rec *recorder, name, resource string, delay time.Duration) cache.ResourceEventHandler {
	note := func(typ string, obj interface{}, initial, resync, tombstone bool) {
		if delay > 0 {
			time.Sleep(delay)
		}
		key, rv, marker, deleting, err := describe(obj)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s %s %s event for a %T: %v\n", name, resource, typ, obj, err)
			return
		}
		rec.write(record{
			Subject:   "client-go",
			Handler:   name,
			Resource:  resource,
			Type:      typ,
			Key:       key,
			RV:        rv,
			Marker:    marker,
			Initial:   initial,
			Resync:    resync,
			Tombstone: tombstone,
			Deleting:  deleting,
			AtNs:      time.Now().UnixNano(),
		})
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			note("add", obj, isInInitialList, false, false)
		},
		UpdateFunc: func(oldObj, newObj interface{}) {
			resync := false
			if o, err := meta.Accessor(oldObj); err == nil {
				if n, err := meta.Accessor(newObj); err == nil {
					resync = o.GetResourceVersion() == n.GetResourceVersion()
				}
			}
			note("update", newObj, false, resync, false)
		},
		DeleteFunc: func(obj interface{}) {
			// A delete the informer inferred from a relist carries the last
			// object it had; the checker wants that object's rv and marker.
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				if t.Obj == nil {
					fmt.Fprintf(os.Stderr, "%s %s tombstone %q without an object\n", name, resource, t.Key)
					return
				}
				note("delete", t.Obj, false, false, true)
				return
			}
			note("delete", obj, false, false, false)
		},
	}
}

// The driver can ask every watch for a short server-side timeout, so watches
// end and restart (resuming from their last resourceVersion) many times in a
// run; 0 leaves client-go's own randomized timeout alone.
func watchTimeout(seconds int64) func(*metav1.ListOptions) {
	return func(opts *metav1.ListOptions) {
		if seconds > 0 {
			opts.TimeoutSeconds = &seconds
		}
	}
}

// Built as the generated informer factories build theirs (same indexers, same
// watch-list wrapper), only with the timeout applied to every watch.
func podInformer(client kubernetes.Interface, timeout func(*metav1.ListOptions)) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	return cache.NewSharedIndexInformer(
		cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return pods.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				timeout(&opts)
				return pods.Watch(ctx, opts)
			},
		}, client),
		&corev1.Pod{},
		0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
	)
}

func dynamicInformer(client dynamic.Interface, gvr schema.GroupVersionResource, timeout func(*metav1.ListOptions)) cache.SharedIndexInformer {
	resource := client.Resource(gvr).Namespace(metav1.NamespaceAll)
	return cache.NewSharedIndexInformer(
		cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return resource.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				timeout(&opts)
				return resource.Watch(ctx, opts)
			},
		}, client),
		&unstructured.Unstructured{},
		0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
	)
}

func reportWatchErrors(informer cache.SharedIndexInformer) error {
	return informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		emit(map[string]interface{}{
			"kind":    "watch_error",
			"gone":    apierrors.IsResourceExpired(err) || apierrors.IsGone(err),
			"message": err.Error(),
			"at_ns":   time.Now().UnixNano(),
		})
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (required)")
	eventsPath := flag.String("events", "", "file to append event records to (required)")
	group := flag.String("widgets-group", "soak.kube-informer.dev", "API group of the widgets CRD")
	version := flag.String("widgets-version", "v1", "version of the widgets CRD")
	resourceName := flag.String("widgets-resource", "widgets", "plural resource name of the widgets CRD")
	watchTimeoutSeconds := flag.Int64("watch-timeout-seconds", 0, "timeoutSeconds asked of every watch (0: client-go's default)")
	slowDelay := flag.Duration("slow-handler-delay", 10*time.Millisecond, "time the slow handler spends on each event")
	flag.Parse()
	if *kubeconfig == "" || *eventsPath == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig and --events are required")
		flag.Usage()
		os.Exit(2)
	}
	if *watchTimeoutSeconds < 0 {
		fatal(fmt.Errorf("--watch-timeout-seconds must not be negative"))
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fatal(err)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		fatal(err)
	}
	dynClient, err := dynamic.NewForConfig(config)
	if err != nil {
		fatal(err)
	}

	// Appending, so a file the driver pre-created (or truncated) is never
	// clobbered from under it.
	f, err := os.OpenFile(*eventsPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fatal(err)
	}
	rec := &recorder{w: bufio.NewWriterSize(f, 1<<16), f: f}

	timeout := watchTimeout(*watchTimeoutSeconds)
	gvr := schema.GroupVersionResource{Group: *group, Version: *version, Resource: *resourceName}
	informers := []struct {
		resource string
		informer cache.SharedIndexInformer
	}{
		{"pods", podInformer(clientset, timeout)},
		{"widgets", dynamicInformer(dynClient, gvr, timeout)},
	}
	for _, inf := range informers {
		if err := reportWatchErrors(inf.informer); err != nil {
			fatal(err)
		}
		for _, h := range []struct {
			name  string
			delay time.Duration
		}{{"fast", 0}, {"slow", *slowDelay}} {
			if _, err := inf.informer.AddEventHandler(handlerFor(rec, h.name, inf.resource, h.delay)); err != nil {
				fatal(err)
			}
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()

	// RunWithContext returns only once every handler goroutine has finished,
	// so waiting on these means no record is still on its way.
	var running sync.WaitGroup
	for _, inf := range informers {
		running.Add(1)
		go func(i cache.SharedIndexInformer) {
			defer running.Done()
			i.RunWithContext(ctx)
		}(inf.informer)
	}

	// Records reach the file within 200 ms even when events are sparse, so a
	// driver reading it mid-run (or after a kill -9) sees recent history.
	flusherDone := make(chan struct{})
	go func() {
		defer close(flusherDone)
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				rec.flush()
			}
		}
	}()

	// Poll every 5 ms: cache.WaitForCacheSync polls every 100 ms, which would
	// blur the synced time the driver measures from.
	var helpers sync.WaitGroup
	helpers.Add(1)
	go func() {
		defer helpers.Done()
		ticker := time.NewTicker(5 * time.Millisecond)
		defer ticker.Stop()
		for {
			synced := true
			for _, inf := range informers {
				synced = synced && inf.informer.HasSynced()
			}
			if synced {
				emit(map[string]interface{}{"kind": "synced", "at_ns": time.Now().UnixNano()})
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()

	// Not in the helpers group: a read from stdin cannot be interrupted, and
	// on SIGTERM the subject must not wait for the driver to close it.
	go func() {
		lateAdded := false
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			switch strings.TrimSpace(scanner.Text()) {
			case "late":
				// A second "late" would add a second handler under the same
				// name, whose records the checker could not tell apart.
				if lateAdded {
					fmt.Fprintln(os.Stderr, "late handlers already added")
					continue
				}
				lateAdded = true
				for _, inf := range informers {
					// Fails only once the informer is stopping; the driver then
					// sees no late_added, which is the truth.
					if _, err := inf.informer.AddEventHandler(handlerFor(rec, "late", inf.resource, 0)); err != nil {
						fmt.Fprintln(os.Stderr, "adding late handler:", err)
						cancel()
						return
					}
				}
				emit(map[string]interface{}{"kind": "late_added", "at_ns": time.Now().UnixNano()})
			case "":
			default:
				fmt.Fprintf(os.Stderr, "unknown command %q\n", scanner.Text())
			}
		}
		if err := scanner.Err(); err != nil {
			fmt.Fprintln(os.Stderr, "stdin:", err)
		}
		cancel()
	}()

	<-ctx.Done()
	stopped := make(chan struct{})
	go func() {
		running.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		fmt.Fprintln(os.Stderr, "informers did not stop within", shutdownGrace)
	}
	helpers.Wait()
	<-flusherDone
	written, err := rec.close()
	emit(map[string]interface{}{"kind": "done", "events": written, "at_ns": time.Now().UnixNano()})
	if err != nil {
		os.Exit(1)
	}
}
