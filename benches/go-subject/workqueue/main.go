// The client-go subject of the workqueue benchmark: the cases of
// benches/benches/workqueue.rs (and benches/src/workqueue_cases.rs) on
// client-go's typed workqueue.
//
// Each case pushes 10,000 distinct items through a fresh queue per iteration:
// add/get/done with 1 and 4 worker goroutines, for uint64 items and for string
// keys "default/object-%05d" (the Rust side queues them as kube_informer's
// ObjectKey, a shared immutable Arc<str>, like for like with a Go string); and
// AddAfter, scheduling only (delays of 60 s + i%1000 s, then ShutDown) and
// firing within a millisecond (delays of 1 + i%1000 µs, drained by one worker).
// After one untimed iteration, a case repeats until --min-ms have passed (at
// least --min-iterations times).
//
// Protocol (shared with benches/src/bin/subject_workqueue.rs): one JSON line,
// {"subject":"client-go","min_ms":...,"cases":[{"name":...,"iterations":...,
// "elapsed_ms":...,"items_per_sec":...},...]}.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"k8s.io/client-go/util/workqueue"
)

const items = 10_000

// addGetDone adds every key while `workers` goroutines get and mark them done;
// it returns once all are done.
func addGetDone[T comparable](keys []T, workers int) {
	queue := workqueue.NewTyped[T]()
	done := make(chan struct{}, workers)
	for range workers {
		go func() {
			for {
				key, shutdown := queue.Get()
				if shutdown {
					break
				}
				queue.Done(key)
			}
			done <- struct{}{}
		}()
	}
	for _, key := range keys {
		queue.Add(key)
	}
	queue.ShutDown()
	for range workers {
		<-done
	}
}

// schedule is scheduling only: the delays are far off, so this is the cost of
// handing items to the waiting loop and its heap.
func schedule() {
	queue := workqueue.NewTypedDelayingQueue[uint64]()
	for i := uint64(0); i < items; i++ {
		queue.AddAfter(i, 60*time.Second+time.Duration(i%1000)*time.Second)
	}
	queue.ShutDown()
}

// fire1ms schedules every item within the next millisecond and drains them with
// one worker: heap, waiting loop and queue together.
func fire1ms() {
	queue := workqueue.NewTypedDelayingQueue[uint64]()
	done := make(chan struct{})
	go func() {
		for range items {
			key, shutdown := queue.Get()
			if shutdown {
				panic("an item")
			}
			queue.Done(key)
		}
		close(done)
	}()
	for i := uint64(0); i < items; i++ {
		queue.AddAfter(i, time.Microsecond+time.Duration(i%1000)*time.Microsecond)
	}
	<-done
	queue.ShutDown()
}

type caseResult struct {
	Name        string  `json:"name"`
	Iterations  int     `json:"iterations"`
	ElapsedMs   float64 `json:"elapsed_ms"`
	ItemsPerSec float64 `json:"items_per_sec"`
}

// measure runs `iteration` once untimed, then until minTime has passed and at
// least minIterations times.
func measure(name string, minTime time.Duration, minIterations int, iteration func()) caseResult {
	iteration()
	runtime.GC()
	n := 0
	start := time.Now()
	for n < minIterations || time.Since(start) < minTime {
		iteration()
		n++
	}
	elapsed := time.Since(start)
	return caseResult{
		Name:        name,
		Iterations:  n,
		ElapsedMs:   float64(elapsed.Nanoseconds()) / 1e6,
		ItemsPerSec: float64(n*items) / elapsed.Seconds(),
	}
}

func main() {
	minMs := flag.Int("min-ms", 1000, "time each case for at least this long, ms")
	minIterations := flag.Int("min-iterations", 3, "and at least this many iterations")
	flag.Parse()
	minTime := time.Duration(*minMs) * time.Millisecond

	numbers := make([]uint64, items)
	names := make([]string, items)
	for i := range numbers {
		numbers[i] = uint64(i)
		names[i] = fmt.Sprintf("default/object-%05d", i)
	}

	var cases []caseResult
	for _, workers := range []int{1, 4} {
		cases = append(cases, measure(fmt.Sprintf("add_get_done/u64/%d", workers), minTime, *minIterations,
			func() { addGetDone(numbers, workers) }))
		cases = append(cases, measure(fmt.Sprintf("add_get_done/string/%d", workers), minTime, *minIterations,
			func() { addGetDone(names, workers) }))
	}
	cases = append(cases, measure("add_after/schedule", minTime, *minIterations, schedule))
	cases = append(cases, measure("add_after/fire_1ms", minTime, *minIterations, fire1ms))

	line, err := json.Marshal(struct {
		Subject string       `json:"subject"`
		MinMs   int          `json:"min_ms"`
		Cases   []caseResult `json:"cases"`
	}{"client-go", *minMs, cases})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}
