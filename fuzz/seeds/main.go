// Command seeds writes the binary part of the fuzz targets' seed corpus: objects, lists,
// watch streams and error bodies encoded by the API server's own serializers
// (k8s.io/apimachinery), and warm-restart snapshots holding such objects, each with the
// prefix byte its target reads first (see the targets in ../fuzz_targets).
//
//	cd fuzz/seeds && go run . ../corpus
package main

import (
	"bytes"
	"encoding/binary"
	stdjson "encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The selection the snapshot_read target reads snapshots as.
const selection = "fuzz"

var (
	scheme    = runtime.NewScheme()
	pbCodec   = protobuf.NewSerializer(scheme, scheme)
	jsonCodec = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{})
	created   = metav1.NewTime(time.Date(2026, 5, 28, 20, 26, 40, 0, time.UTC))
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: seeds CORPUS_DIR")
		os.Exit(2)
	}
	out := os.Args[1]
	pod := webPod("web-7d9f8b6c5-x2v4q", "12345")
	configMap := config()
	deployment := webDeployment()
	service := webService()

	// protobuf_typed and protobuf_dynamic: kind in the low bits, bit 7 for "typed".
	for i, object := range []marshaler{pod, configMap, deployment, service} {
		message := must(object.Marshal())
		write(out, "protobuf_typed", fmt.Sprintf("%s-list-item", kindOf(object)), append([]byte{byte(i)}, message...))
		write(out, "protobuf_typed", fmt.Sprintf("%s-watch-object", kindOf(object)), append([]byte{byte(i) | 0x80}, message...))
		write(out, "protobuf_dynamic", fmt.Sprintf("%s-watch-object", kindOf(object)), append([]byte{byte(i) | 0x80}, message...))
	}

	// Watch streams of Pods: the first byte is the size of the chunks the body arrives in.
	status := expired()
	bookmark := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			ResourceVersion: "12400",
			Annotations:     map[string]string{"k8s.io/initial-events-end": "true"},
		},
	}
	modified := pod.DeepCopy()
	modified.ResourceVersion = "12346"
	modified.Labels["tier"] = "front"
	events := []struct {
		kind   string
		object runtime.Object
	}{
		{"ADDED", pod},
		{"MODIFIED", modified},
		{"BOOKMARK", bookmark},
		{"DELETED", modified},
		{"ERROR", status},
	}
	var frames, lines bytes.Buffer
	framer := protobuf.LengthDelimitedFramer.NewFrameWriter(&frames)
	for _, event := range events {
		frame := metav1.WatchEvent{Type: event.kind, Object: runtime.RawExtension{Raw: encode(pbCodec, event.object)}}
		must(framer.Write(must(frame.Marshal())))
		line := metav1.WatchEvent{Type: event.kind, Object: runtime.RawExtension{Raw: encode(jsonCodec, event.object)}}
		lines.Write(must(stdjson.Marshal(&line)))
		lines.WriteByte('\n')
	}
	write(out, "watch_protobuf_frames", "events-whole", append([]byte{0}, frames.Bytes()...))
	write(out, "watch_protobuf_frames", "events-in-7-byte-chunks", append([]byte{7}, frames.Bytes()...))
	write(out, "watch_json_lines", "events-whole", append([]byte{0}, lines.Bytes()...))
	write(out, "watch_json_lines", "events-in-13-byte-chunks", append([]byte{13}, lines.Bytes()...))

	// List bodies: bit 0 of the first byte for protobuf, the rest the chunk size.
	list := &corev1.PodList{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "12400", Continue: "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTI0MDB9"},
		Items:    []corev1.Pod{*pod, *webPod("web-7d9f8b6c5-k8m2p", "12390")},
	}
	write(out, "list_body", "pods-protobuf", append([]byte{1}, encode(pbCodec, list)...))
	write(out, "list_body", "pods-protobuf-in-5-byte-chunks", append([]byte{5<<1 | 1}, encode(pbCodec, list)...))
	write(out, "list_body", "pods-json", append([]byte{0}, encode(jsonCodec, list)...))
	write(out, "list_body", "pods-json-in-9-byte-chunks", append([]byte{9 << 1}, encode(jsonCodec, list)...))

	// Error bodies: bit 0 of the first byte for protobuf, the rest picks the HTTP code.
	forbidden := &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  `pods is forbidden: User "system:serviceaccount:default:web" cannot list resource "pods" in API group "" at the cluster scope`,
		Reason:   metav1.StatusReasonForbidden,
		Details:  &metav1.StatusDetails{Kind: "pods", Causes: []metav1.StatusCause{{Type: "FieldValueInvalid", Message: "denied", Field: "spec"}}, RetryAfterSeconds: 3},
		Code:     403,
	}
	write(out, "status_body", "expired-protobuf", append([]byte{1}, encode(pbCodec, status)...))
	write(out, "status_body", "expired-json", append([]byte{0}, encode(jsonCodec, status)...))
	write(out, "status_body", "forbidden-protobuf", append([]byte{1}, encode(pbCodec, forbidden)...))
	write(out, "status_body", "forbidden-json", append([]byte{0}, encode(jsonCodec, forbidden)...))
	write(out, "status_body", "proxy-page", append([]byte{2 << 1}, "<html><body><h1>502 Bad Gateway</h1></body></html>\n"...))

	// Snapshots: the first byte picks how the rest becomes the file (0: as it is, 2: a
	// body that the target wraps in the header and the checksum).
	podMessage := must(pod.Marshal())
	records := []record{
		{tag: 0, key: "default/web-json", version: "12001", labels: [][2]string{{"app", "web"}, {"tier", "front"}}, bytes: encode(jsonCodec, webPod("web-json", "12001"))},
		{tag: 1, key: "default/" + pod.Name, version: pod.ResourceVersion, labels: sortedLabels(pod.Labels), bytes: podMessage},
		{tag: 2, key: "default/" + modified.Name, version: modified.ResourceVersion, labels: sortedLabels(modified.Labels), bytes: must(modified.Marshal())},
	}
	full := snapshotBody("12400", "/v1/pods", records)
	write(out, "snapshot_read", "pods-file", append([]byte{0}, file(full)...))
	write(out, "snapshot_read", "pods-body", append([]byte{2}, full...))
	write(out, "snapshot_read", "json-only-body", append([]byte{2}, snapshotBody("7", "", records[:1])...))
}

type marshaler interface {
	runtime.Object
	Marshal() ([]byte, error)
}

func must[T any](value T, err error) T {
	if err != nil {
		panic(err)
	}
	return value
}

func kindOf(object runtime.Object) string {
	return strings.ToLower(object.GetObjectKind().GroupVersionKind().Kind)
}

func encode(encoder runtime.Encoder, object runtime.Object) []byte {
	var buf bytes.Buffer
	if err := encoder.Encode(object, &buf); err != nil {
		panic(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func write(dir, target, name string, data []byte) {
	path := filepath.Join(dir, target, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		panic(err)
	}
}

func webPod(name, version string) *corev1.Pod {
	grace := int64(30)
	tolerate := int64(300)
	nonRoot := true
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			GenerateName:      "web-7d9f8b6c5-",
			Namespace:         "default",
			UID:               types.UID("5f0c2b9e-8d0e-4c1a-9f57-2b1d6a0c3e41"),
			ResourceVersion:   version,
			CreationTimestamp: created,
			Labels:            map[string]string{"app": "web", "pod-template-hash": "7d9f8b6c5"},
			Annotations:       map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-05-28T20:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8b6c5",
				UID: types.UID("0a1b2c3d-4e5f-4061-8273-948596a7b8c9"), Controller: &nonRoot, BlockOwnerDeletion: &nonRoot,
			}},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", Time: &created, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{}}}}}`)},
			}, {
				Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &created, FieldsType: "FieldsV1", Subresource: "status",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{}}},"f:podIP":{}}}`)},
			}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "web",
				Image: "nginx:1.27",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{
					{Name: "MODE", Value: "production"},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 5},
				LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}}},
			}},
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &grace,
			NodeName:                      "node-1",
			ServiceAccountName:            "web",
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: &nonRoot},
			Tolerations: []corev1.Toleration{{
				Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &tolerate,
			}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: created}},
			HostIP:     "10.0.0.5",
			PodIP:      "10.244.1.17",
			PodIPs:     []corev1.PodIP{{IP: "10.244.1.17"}, {IP: "fd00:10:244:1::11"}},
			StartTime:  &created,
			QOSClass:   corev1.PodQOSBurstable,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "web", Ready: true, RestartCount: 2, Image: "docker.io/library/nginx:1.27",
				ImageID:     "docker.io/library/nginx@sha256:0f04e4f646a3f14bf31d8bc8d885b6c951fdcf42589d06845f64d18aec6a3c4d",
				ContainerID: "containerd://4f3c2b1a", Started: &nonRoot,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: created}},
			}},
		},
	}
}

func config() *corev1.ConfigMap {
	immutable := false
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-config", Namespace: "default", ResourceVersion: "777", Labels: map[string]string{"app": "web"}},
		Data:       map[string]string{"mode": "production", "nginx.conf": "server {\n  listen 80;\n}\n", "empty": ""},
		BinaryData: map[string][]byte{"blob": {0, 1, 2, 0xff}},
		Immutable:  &immutable,
	}
}

func webDeployment() *appsv1.Deployment {
	replicas := int32(3)
	surge := intstr.FromString("25%")
	unavailable := intstr.FromInt32(0)
	template := webPod("", "")
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", ResourceVersion: "900", Generation: 4, CreationTimestamp: created},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"app": "web"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"front", "back"}}},
			},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}}, Spec: template.Spec},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}},
		},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 4, Replicas: 3, ReadyReplicas: 3, AvailableReplicas: 3, UpdatedReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, LastUpdateTime: created, LastTransitionTime: created, Reason: "MinimumReplicasAvailable"}},
		},
	}
}

func webService() *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", ResourceVersion: "901"},
		Spec: corev1.ServiceSpec{
			Type:            corev1.ServiceTypeClusterIP,
			Selector:        map[string]string{"app": "web"},
			ClusterIP:       "10.96.12.34",
			ClusterIPs:      []string{"10.96.12.34"},
			IPFamilies:      []corev1.IPFamily{corev1.IPv4Protocol},
			SessionAffinity: corev1.ServiceAffinityNone,
			Ports:           []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}},
		},
	}
}

func expired() *metav1.Status {
	return &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  "too old resource version: 1 (12345)",
		Reason:   metav1.StatusReasonExpired,
		Code:     410,
	}
}

func sortedLabels(labels map[string]string) [][2]string {
	keys := make([]string, 0, len(labels))
	for key := range labels {
		keys = append(keys, key)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	pairs := make([][2]string, 0, len(keys))
	for _, key := range keys {
		pairs = append(pairs, [2]string{key, labels[key]})
	}
	return pairs
}

// A snapshot record: how its bytes decode (0 JSON, 1 protobuf, 2 protobuf with its type),
// the object's key, resourceVersion and labels, and its bytes.
type record struct {
	tag     byte
	key     string
	version string
	labels  [][2]string
	bytes   []byte
}

// snapshotBody is a snapshot of format 2 without its magic, format version and checksum.
func snapshotBody(version, protobufName string, records []record) []byte {
	var out bytes.Buffer
	text := func(b []byte) {
		must(0, binary.Write(&out, binary.LittleEndian, uint32(len(b))))
		out.Write(b)
	}
	text([]byte(selection))
	text([]byte(version))
	text([]byte(protobufName))
	must(0, binary.Write(&out, binary.LittleEndian, uint64(len(records))))
	for _, r := range records {
		out.WriteByte(r.tag)
		text([]byte(r.key))
		text([]byte(r.version))
		must(0, binary.Write(&out, binary.LittleEndian, uint32(len(r.labels))))
		for _, label := range r.labels {
			text([]byte(label[0]))
			text([]byte(label[1]))
		}
		text(r.bytes)
	}
	return out.Bytes()
}

// file is a whole snapshot file around body.
func file(body []byte) []byte {
	var out bytes.Buffer
	out.WriteString("kube-informer snapshot\n\x00")
	must(0, binary.Write(&out, binary.LittleEndian, uint32(2)))
	out.Write(body)
	must(0, binary.Write(&out, binary.LittleEndian, crc32.ChecksumIEEE(out.Bytes())))
	return out.Bytes()
}
