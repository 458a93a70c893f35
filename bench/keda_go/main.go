// The KEDA model of bench/bench_keda.py in KEDA's own language and gRPC library (grpc-go,
// an older release than KEDA's), so that the client's share of a call is about KEDA's
// rather than the Python model's. The same pattern, argument for argument (see the Python
// model, class Keda, for where each rule is read in KEDA's code): one ClientConn with
// KEDA's round_robin service config; per ScaledObject a poll every 30 s at the phase its
// reconcile gave it (GetMetricSpec unless streamed, GetMetrics, IsActive, no deadline);
// the HPA controller's 5 workers syncing every HPA every 15 s, the same chain under a 3 s
// deadline; one retry of a chain after an error; with push, a StreamIsActive and a
// StreamMetricSpec per ScaledObject, reopened after 2 s doubling to 60 s; freshness
// probes through the agent generators' control ports.
//
// Usage (bench_keda.py builds and runs it): keda_go TARGET N SECONDS WARMUP PUSH CONTROLS
// TARGET is host:port, or ipv4:host:port,host:port,... for several scaler replicas (the
// addresses a headless Service's DNS name gives KEDA's resolver). It prints "window" when
// the measured window opens, "end" when it closes, then one JSON object with the keys of
// the Python model's result.
package main

import (
	"bufio"
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	pb "kedamodel/externalscaler"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

const (
	workloads   = 1000
	pods        = 8
	pollS       = 30 * time.Second
	hpaS        = 15 * time.Second
	hpaWorkers  = 5
	hpaDeadline = 3 * time.Second
	metricName  = "gpuscale-gpu-utilization"
	// KEDA's external scaler: pkg/scalers/external_scaler.go L62.
	serviceConfig = `{"loadBalancingConfig": [{"round_robin": {}}]}`
)

var methods = []string{"GetMetricSpec", "GetMetrics", "IsActive"}

// ms is a figure in milliseconds. NaN (no sample) is written as Python's json writes it,
// NaN, which encoding/json refuses from a marshaller: a placeholder, replaced at the end.
type ms float64

const nanMark = `"-NaN-"`

func (v ms) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(v)) {
		return []byte(nanMark), nil
	}
	return json.Marshal(float64(v))
}

// pct is bench_scaler.pct: the q-quantile in milliseconds, NaN when empty.
func pct(values []time.Duration, q float64) ms {
	if len(values) == 0 {
		return ms(math.NaN())
	}
	s := append([]time.Duration(nil), values...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	i := int(q * float64(len(s)))
	if i > len(s)-1 {
		i = len(s) - 1
	}
	return ms(float64(s[i]) / 1e6)
}

// codeNames are the status codes as Python's grpc names them (grpc.StatusCode), so
// error counts read the same from both models.
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

func codeName(err error) string {
	code := status.Code(err)
	if name, ok := codeNames[code]; ok {
		return name
	}
	return code.String()
}

func ref(i int) *pb.ScaledObjectRef {
	w := i % workloads
	return &pb.ScaledObjectRef{Name: fmt.Sprintf("so-%d", i), Namespace: fmt.Sprintf("ns%d", w%10),
		ScalerMetadata: map[string]string{"podSelector": fmt.Sprintf("app=w%d", w)}}
}

type keda struct {
	client     pb.ExternalScalerClient
	n          int
	push       bool
	refs       []*pb.ScaledObjectRef
	specCached []int32 // 1 once the trigger's StreamMetricSpec delivered
	measuring  int32
	stopping   int32

	mu            sync.Mutex
	lat           map[string][]time.Duration
	chains        map[string][]time.Duration
	hpaLate       []time.Duration
	errors        map[string]int
	chainFailures map[string]int
	streamsFirst  map[string]int
	streamErrors  map[string]int
	pushes        int
	firstPush     []time.Duration
	unseen        []string
	clientLag     []time.Duration
	probes        []time.Duration
}

func (k *keda) isMeasuring() bool { return atomic.LoadInt32(&k.measuring) == 1 }
func (k *keda) stopped() bool     { return atomic.LoadInt32(&k.stopping) == 1 }

func (k *keda) count(m map[string]int, key string) {
	k.mu.Lock()
	m[key]++
	k.mu.Unlock()
}

func (k *keda) call(ctx context.Context, method string, do func(context.Context) error) error {
	t0 := time.Now()
	err := do(ctx)
	if !k.isMeasuring() {
		return err
	}
	if err != nil {
		k.count(k.errors, method+" "+codeName(err))
		return err
	}
	d := time.Since(t0)
	k.mu.Lock()
	k.lat[method] = append(k.lat[method], d)
	k.mu.Unlock()
	return nil
}

// trigger makes one trigger's calls: GetMetricSpec (unless streamed), GetMetrics, IsActive.
func (k *keda) trigger(ctx context.Context, i int) error {
	r := k.refs[i]
	name := metricName
	if atomic.LoadInt32(&k.specCached[i]) == 0 {
		err := k.call(ctx, "GetMetricSpec", func(c context.Context) error {
			spec, err := k.client.GetMetricSpec(c, r)
			if err == nil && len(spec.MetricSpecs) > 0 {
				name = spec.MetricSpecs[0].MetricName
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	req := &pb.GetMetricsRequest{ScaledObjectRef: r, MetricName: name}
	if err := k.call(ctx, "GetMetrics", func(c context.Context) error {
		_, err := k.client.GetMetrics(c, req)
		return err
	}); err != nil {
		return err
	}
	return k.call(ctx, "IsActive", func(c context.Context) error {
		_, err := k.client.IsActive(c, r)
		return err
	})
}

// chain is one poll or HPA sync: the trigger's calls, once more after an error (KEDA
// rebuilds the trigger's scaler and retries).
func (k *keda) chain(kind string, i int, deadline time.Duration) {
	t0 := time.Now()
	ctx := context.Background()
	if deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, t0.Add(deadline))
		defer cancel()
	}
	err := k.trigger(ctx, i)
	if err != nil {
		err = k.trigger(ctx, i)
	}
	if !k.isMeasuring() {
		return
	}
	if err != nil {
		k.count(k.chainFailures, kind+" "+codeName(err))
		return
	}
	d := time.Since(t0)
	k.mu.Lock()
	k.chains[kind] = append(k.chains[kind], d)
	k.mu.Unlock()
}

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

func (k *keda) poller(i int, start time.Time) {
	due := start.Add(time.Duration(rand.Float64() * float64(pollS))) // its reconcile's phase
	for !k.stopped() {
		sleepUntil(due)
		if k.stopped() {
			return
		}
		due = due.Add(pollS) // start to start: a slow check does not shift the phase
		k.chain("poll", i, 0)
	}
}

type dueItem struct {
	due time.Time
	i   int
}
type dueHeap []dueItem

func (h dueHeap) Len() int            { return len(h) }
func (h dueHeap) Less(a, b int) bool  { return h[a].due.Before(h[b].due) }
func (h dueHeap) Swap(a, b int)       { h[a], h[b] = h[b], h[a] }
func (h *dueHeap) Push(x interface{}) { *h = append(*h, x.(dueItem)) }
func (h *dueHeap) Pop() interface{} {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// syncQueue is the HPA controller's work queue: unbounded, as the Python model's
// asyncio.Queue (a bounded one would hold the scheduler back and hide how late syncs run).
type syncQueue struct {
	mu    sync.Mutex
	ready *sync.Cond
	items []dueItem
}

func (q *syncQueue) put(item dueItem) {
	q.mu.Lock()
	q.items = append(q.items, item)
	q.mu.Unlock()
	q.ready.Signal()
}

func (q *syncQueue) get() dueItem {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 {
		q.ready.Wait()
	}
	item := q.items[0]
	q.items = q.items[1:]
	return item
}

// hpa is the HPA controller: every HPA every 15 s, 5 workers taking what is due.
func (k *keda) hpa(start time.Time) {
	queue := &syncQueue{}
	queue.ready = sync.NewCond(&queue.mu)
	for w := 0; w < hpaWorkers; w++ {
		go func() {
			for !k.stopped() {
				item := queue.get()
				if k.stopped() {
					return
				}
				if k.isMeasuring() {
					late := time.Since(item.due)
					k.mu.Lock()
					k.hpaLate = append(k.hpaLate, late)
					k.mu.Unlock()
				}
				k.chain("hpa", item.i, hpaDeadline)
			}
		}()
	}
	h := make(dueHeap, 0, k.n)
	for i := 0; i < k.n; i++ {
		h = append(h, dueItem{start.Add(time.Duration(rand.Float64() * float64(hpaS))), i})
	}
	heap.Init(&h)
	for !k.stopped() {
		item := h[0]
		sleepUntil(item.due)
		h[0].due = item.due.Add(hpaS)
		heap.Fix(&h, 0)
		queue.put(item)
	}
}

type recvStream interface{ RecvMsg(m interface{}) error }

// stream is one external-push stream, reopened as KEDA reopens it.
func (k *keda) stream(ctx context.Context, i int, kind string, opened time.Time) {
	backoff := 2 * time.Second
	for !k.stopped() {
		var s recvStream
		var err error
		var msg interface{}
		if kind == "StreamIsActive" {
			s, err = k.client.StreamIsActive(ctx, k.refs[i])
			msg = new(pb.IsActiveResponse)
		} else {
			s, err = k.client.StreamMetricSpec(ctx, k.refs[i])
			msg = new(pb.GetMetricSpecResponse)
		}
		first := true
		for err == nil {
			if err = s.RecvMsg(msg); err != nil {
				break
			}
			k.mu.Lock()
			if first {
				k.streamsFirst[kind]++
				k.firstPush = append(k.firstPush, time.Since(opened))
			}
			k.pushes++
			k.mu.Unlock()
			if first && kind == "StreamMetricSpec" { // KEDA resets its backoff once this
				atomic.StoreInt32(&k.specCached[i], 1) // stream delivered (L310-315)
				backoff = 2 * time.Second
			}
			first = false
		}
		if err == io.EOF {
			backoff = 2 * time.Second // an orderly end resets it for both (L252-257)
		} else {
			if k.stopped() {
				return
			}
			k.count(k.streamErrors, kind+" "+codeName(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff *= 2
		if backoff > 60*time.Second {
			backoff = 60 * time.Second
		}
		opened = time.Now()
	}
}

// ownLag: how late a 1 ms timer runs in this client (a call's latency includes it).
func (k *keda) ownLag() {
	for !k.stopped() {
		t0 := time.Now()
		time.Sleep(time.Millisecond)
		if k.isMeasuring() {
			late := time.Since(t0) - time.Millisecond
			k.mu.Lock()
			k.clientLag = append(k.clientLag, late)
			k.mu.Unlock()
		}
	}
}

// flip flips a node's boost through its generator's control port (bench_fleet.py's
// protocol: the node's number in, the new boost out).
func flip(port, node int) (float64, error) {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err = conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, err
	}
	if _, err = fmt.Fprintf(conn, "%d\n", node); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.TrimSpace(line), 64)
}

// freshness flips a node's load through its generator's control port, then asks
// GetMetrics on the same connection every 20 ms until the value moved.
func (k *keda) freshness(controls [][3]int) {
	for len(controls) > 0 && !k.stopped() {
		time.Sleep(2*time.Second + time.Duration(rand.Float64()*float64(time.Second)))
		node := rand.Intn(controls[len(controls)-1][1])
		port := 0
		for _, c := range controls {
			if c[0] <= node && node < c[1] {
				port = c[2]
				break
			}
		}
		w := (node * pods) % workloads
		req := &pb.GetMetricsRequest{ScaledObjectRef: ref(w), MetricName: metricName}
		value := func() (float64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := k.client.GetMetrics(ctx, req)
			if err != nil || len(got.MetricValues) == 0 {
				return 0, fmt.Errorf("no value: %v", err)
			}
			return got.MetricValues[0].MetricValueFloat, nil
		}
		before, err := value()
		if err != nil {
			continue
		}
		t0 := time.Now() // before the flip: a change published before its reply counts
		boost, err := flip(port, node)
		if err != nil {
			continue
		}
		last, err := value()
		for err == nil && math.Abs(last-before) < 150 && time.Since(t0) < 10*time.Second {
			time.Sleep(20 * time.Millisecond)
			last, err = value()
		}
		if err != nil || !k.isMeasuring() {
			continue
		}
		took := time.Since(t0)
		k.mu.Lock()
		k.probes = append(k.probes, took)
		if took >= 10*time.Second {
			k.unseen = append(k.unseen, fmt.Sprintf("node %d (+%g): %.0f -> %.0f", node, boost,
				before, last))
		}
		k.mu.Unlock()
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func summary(v []time.Duration) map[string]interface{} {
	return map[string]interface{}{"n": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for key, v := range m {
		out[key] = v
	}
	return out
}

func (k *keda) run(seconds, warmup time.Duration, controls [][3]int) map[string]interface{} {
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if k.push {
		for i := 0; i < k.n; i++ {
			go k.stream(ctx, i, "StreamIsActive", start)
			go k.stream(ctx, i, "StreamMetricSpec", start)
		}
	}
	for i := 0; i < k.n; i++ {
		go k.poller(i, start)
	}
	go k.hpa(start)
	go k.ownLag()
	go k.freshness(controls)
	time.Sleep(warmup)
	k.mu.Lock()
	atWarmup := copyCounts(k.streamsFirst)
	k.mu.Unlock()
	atomic.StoreInt32(&k.measuring, 1)
	fmt.Println("window")
	cpu0, t0 := cpuSeconds(), time.Now()
	time.Sleep(seconds)
	atomic.StoreInt32(&k.measuring, 0)
	wall := time.Since(t0).Seconds()
	cpu := cpuSeconds() - cpu0
	fmt.Println("end")
	atomic.StoreInt32(&k.stopping, 1)
	cancel()

	k.mu.Lock()
	defer k.mu.Unlock()
	var every []time.Duration
	perMethod := map[string]interface{}{}
	for _, m := range methods {
		every = append(every, k.lat[m]...)
		perMethod[m] = summary(k.lat[m])
	}
	chains := map[string]interface{}{}
	for kind, v := range k.chains {
		chains[kind] = summary(v)
	}
	fresh := make([]float64, 0, len(k.probes))
	for _, p := range k.probes {
		fresh = append(fresh, float64(p)/1e6)
	}
	sort.Float64s(fresh)
	var maxLag time.Duration
	for _, l := range k.clientLag {
		if l > maxLag {
			maxLag = l
		}
	}
	unseen := append([]string{}, k.unseen...)
	return map[string]interface{}{
		"objects":                     k.n,
		"push":                        k.push,
		"seconds":                     wall,
		"calls":                       len(every),
		"calls_per_s":                 float64(len(every)) / wall,
		"call_p50_ms":                 pct(every, 0.5),
		"call_p99_ms":                 pct(every, 0.99),
		"per_method":                  perMethod,
		"chains":                      chains,
		"hpa_late_p99_ms":             pct(k.hpaLate, 0.99),
		"errors":                      copyCounts(k.errors),
		"chain_failures":              copyCounts(k.chainFailures),
		"streams_delivered_by_warmup": atWarmup,
		"streams_delivered":           copyCounts(k.streamsFirst),
		"stream_errors":               copyCounts(k.streamErrors),
		"pushes":                      k.pushes,
		"first_push_p99_s":            pct(k.firstPush, 0.99) / 1e3,
		"freshness_ms":                fresh,
		"unseen":                      unseen,
		"client_cpu":                  cpu / wall,
		"client_lag_p50_p99_max_ms": []ms{pct(k.clientLag, 0.5), pct(k.clientLag, 0.99),
			ms(float64(maxLag) / 1e6)},
		"client": "grpc-go " + grpc.Version,
	}
}

// dial makes KEDA's one connection. (grpc-go 1.33 has transparent retries off by
// default, newer grpc-go and the Python model's C core have them on; no run of the bench
// has had an error to retry.)
func dial(target string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithInsecure(), grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4 * 1024 * 1024))}
	if strings.HasPrefix(target, "ipv4:") {
		// Several replicas: the address list a headless Service's DNS name resolves to.
		r := manual.NewBuilderWithScheme("bench")
		var addrs []resolver.Address
		for _, a := range strings.Split(strings.TrimPrefix(target, "ipv4:"), ",") {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
		r.InitialState(resolver.State{Addresses: addrs})
		opts = append(opts, grpc.WithResolvers(r))
		target = r.Scheme() + ":///scalers"
	}
	return grpc.Dial(target, opts...)
}

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: keda_go TARGET N SECONDS WARMUP PUSH CONTROLS")
		os.Exit(2)
	}
	n, err1 := strconv.Atoi(os.Args[2])
	seconds, err2 := strconv.ParseFloat(os.Args[3], 64)
	warmup, err3 := strconv.ParseFloat(os.Args[4], 64)
	var controls [][3]int
	err4 := json.Unmarshal([]byte(os.Args[6]), &controls)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			fmt.Fprintln(os.Stderr, "keda_go:", err)
			os.Exit(2)
		}
	}
	rand.Seed(time.Now().UnixNano()) // phases and probes of their own in each run
	conn, err := dial(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "keda_go:", err)
		os.Exit(1)
	}
	defer conn.Close()
	k := &keda{client: pb.NewExternalScalerClient(conn), n: n, push: os.Args[5] == "1",
		specCached: make([]int32, n), lat: map[string][]time.Duration{},
		chains: map[string][]time.Duration{"hpa": nil, "poll": nil}, errors: map[string]int{},
		chainFailures: map[string]int{}, streamsFirst: map[string]int{},
		streamErrors: map[string]int{}}
	for i := 0; i < n; i++ {
		k.refs = append(k.refs, ref(i))
	}
	// As the Python model waits for channel_ready: connect before the pattern starts.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, _ = pb.NewExternalScalerClient(conn).IsActive(ctx, k.refs[0], grpc.WaitForReady(true))
	cancel()
	got := k.run(time.Duration(seconds*float64(time.Second)),
		time.Duration(warmup*float64(time.Second)), controls)
	out, err := json.Marshal(got)
	if err != nil {
		fmt.Fprintln(os.Stderr, "keda_go:", err)
		os.Exit(1)
	}
	fmt.Println(strings.ReplaceAll(string(out), nanMark, "NaN"))
}
