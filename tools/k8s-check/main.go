// k8s-check reads the documents `helm template` renders (standard input) and refuses what a cluster
// would refuse, or what would start but not work:
//
//   - every document decodes strictly into its Kubernetes API type (k8s.io/api, and the Prometheus
//     operator's for ServiceMonitor and PrometheusRule): an unknown or duplicated field, a wrong
//     type or an unknown kind is an error;
//   - names, labels, ports and environment variables are valid; every selector selects what it is
//     for (a workload its own pods, a Service and a PodDisruptionBudget some workload, a
//     ServiceMonitor some Service); every named port, volume, ConfigMap and $(VAR) is defined;
//   - every container runs non-root on a read-only root file system;
//   - with -bin-dir, every VITALS_* variable and --flag a container passes exists in its binary's
//     --help (run from that folder), and every TOML file a ConfigMap carries parses.
//
// It prints one line per document and exits 1 with every problem listed.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// A pod template with where it came from.
type workload struct {
	name     string
	selector *metav1.LabelSelector
	template corev1.PodTemplateSpec
}

type checker struct {
	problems   []string
	workloads  []workload
	services   []*corev1.Service
	pdbs       []*policyv1.PodDisruptionBudget
	monitors   []*monitoringv1.ServiceMonitor
	configMaps map[string]*corev1.ConfigMap
	statefuls  []*appsv1.StatefulSet
	binDir     string
	helps      map[string]string
	log        io.Writer
}

func (c *checker) fail(where, format string, args ...any) {
	c.problems = append(c.problems, where+": "+fmt.Sprintf(format, args...))
}

func main() {
	binDir := flag.String("bin-dir", "", "folder of the vitals binaries, to check flags and variables against their --help")
	flag.Parse()
	c, n, err := check(os.Stdin, *binDir, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s-check:", err)
		os.Exit(2)
	}
	if len(c.problems) > 0 {
		for _, p := range c.problems {
			fmt.Println("PROBLEM", p)
		}
		fmt.Printf("k8s-check: %d problem(s) in %d documents\n", len(c.problems), n)
		os.Exit(1)
	}
	fmt.Printf("k8s-check: %d documents valid\n", n)
}

// check reads a rendered stream and returns the checker with its problems and the documents' count.
func check(r io.Reader, binDir string, log io.Writer) (*checker, int, error) {
	c := &checker{configMaps: map[string]*corev1.ConfigMap{}, binDir: binDir, helps: map[string]string{}, log: log}
	docs, err := split(r)
	if err != nil {
		return nil, 0, err
	}
	if len(docs) == 0 {
		return nil, 0, fmt.Errorf("no documents on standard input")
	}
	for i, doc := range docs {
		c.decode(i, doc)
	}
	c.crossCheck()
	return c, len(docs), nil
}

// split cuts a YAML stream into its non-empty documents.
func split(r io.Reader) ([][]byte, error) {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if body := bytes.TrimSpace(stripComments(cur.Bytes())); len(body) > 0 {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
		}
		cur.Reset()
	}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	for s.Scan() {
		line := s.Text()
		if line == "---" || strings.HasPrefix(line, "--- ") {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs, s.Err()
}

func stripComments(b []byte) []byte {
	var out bytes.Buffer
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

func (c *checker) decode(i int, doc []byte) {
	var h header
	if err := yaml.Unmarshal(doc, &h); err != nil {
		c.fail(fmt.Sprintf("document %d", i), "not YAML: %v", err)
		return
	}
	where := fmt.Sprintf("document %d (%s %s)", i, h.APIVersion, h.Kind)
	strict := func(into any) bool {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			c.fail(where, "does not decode strictly: %v", err)
			return false
		}
		return true
	}
	var meta *metav1.ObjectMeta
	switch h.APIVersion + " " + h.Kind {
	case "v1 Service":
		o := &corev1.Service{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.services = append(c.services, o)
			c.checkService(o)
		}
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.configMaps[o.Name] = o
			c.checkConfigMap(o)
		}
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		if strict(o) {
			meta = &o.ObjectMeta
		}
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.addWorkload("Deployment "+o.Name, o.Spec.Selector, o.Spec.Template)
		}
	case "apps/v1 StatefulSet":
		o := &appsv1.StatefulSet{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.statefuls = append(c.statefuls, o)
			c.addWorkload("StatefulSet "+o.Name, o.Spec.Selector, o.Spec.Template)
		}
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.pdbs = append(c.pdbs, o)
			if (o.Spec.MinAvailable == nil) == (o.Spec.MaxUnavailable == nil) {
				c.fail("PodDisruptionBudget "+o.Name, "needs exactly one of minAvailable and maxUnavailable")
			}
		}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		o := &monitoringv1.ServiceMonitor{}
		if strict(o) {
			meta = &o.ObjectMeta
			c.monitors = append(c.monitors, o)
		}
	case "monitoring.coreos.com/v1 PrometheusRule":
		o := &monitoringv1.PrometheusRule{}
		if strict(o) {
			meta = &o.ObjectMeta
			if len(o.Spec.Groups) == 0 {
				c.fail("PrometheusRule "+o.Name, "has no rule groups")
			}
			for _, g := range o.Spec.Groups {
				for _, r := range g.Rules {
					if r.Alert == "" && r.Record == "" || r.Expr.String() == "" {
						c.fail("PrometheusRule "+o.Name, "group %s has a rule without a name or an expression", g.Name)
					}
				}
			}
		}
	default:
		c.fail(where, "a kind this chart is not expected to render")
		return
	}
	if meta != nil {
		c.checkMeta(h.Kind, meta)
		fmt.Fprintf(c.log, "ok %s %s\n", h.Kind, meta.Name)
	}
}

func (c *checker) checkMeta(kind string, m *metav1.ObjectMeta) {
	where := kind + " " + m.Name
	if m.Name == "" {
		c.fail(where, "has no name")
	}
	nameCheck := validation.IsDNS1123Subdomain
	if kind == "Service" {
		nameCheck = validation.IsDNS1035Label
	}
	for _, e := range nameCheck(m.Name) {
		c.fail(where, "name: %s", e)
	}
	c.checkLabels(where, m.Labels)
	for k := range m.Annotations {
		for _, e := range validation.IsQualifiedName(k) {
			c.fail(where, "annotation %q: %s", k, e)
		}
	}
}

func (c *checker) checkLabels(where string, l map[string]string) {
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			c.fail(where, "label %q: %s", k, e)
		}
		for _, e := range validation.IsValidLabelValue(v) {
			c.fail(where, "label %q value %q: %s", k, v, e)
		}
	}
}

func (c *checker) addWorkload(where string, sel *metav1.LabelSelector, t corev1.PodTemplateSpec) {
	c.workloads = append(c.workloads, workload{name: where, selector: sel, template: t})
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || sel == nil || s.Empty() {
		c.fail(where, "needs a non-empty selector (%v)", err)
	} else if !s.Matches(labels.Set(t.Labels)) {
		c.fail(where, "selector %s does not match its pod template's labels %v", s, t.Labels)
	}
	c.checkLabels(where+" pod template", t.Labels)
	c.checkPod(where, &t.Spec)
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func (c *checker) checkPod(where string, p *corev1.PodSpec) {
	if len(p.Containers) == 0 {
		c.fail(where, "has no containers")
	}
	volumes := map[string]bool{}
	for _, v := range p.Volumes {
		volumes[v.Name] = true
		if v.Secret != nil && v.Secret.SecretName == "" {
			c.fail(where, "volume %s names no Secret", v.Name)
		}
	}
	root := p.SecurityContext
	for _, ct := range p.Containers {
		cw := where + " container " + ct.Name
		for _, e := range validation.IsDNS1123Label(ct.Name) {
			c.fail(cw, "name: %s", e)
		}
		if ct.Image == "" {
			c.fail(cw, "has no image")
		}
		sc := ct.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			c.fail(cw, "must run with a read-only root file system")
		}
		nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
			(root != nil && root.RunAsNonRoot != nil && *root.RunAsNonRoot)
		if !nonRoot {
			c.fail(cw, "must run as non-root (runAsNonRoot)")
		}
		ports := map[string]bool{}
		numbers := map[int32]bool{}
		for _, port := range ct.Ports {
			if port.Name != "" {
				for _, e := range validation.IsValidPortName(port.Name) {
					c.fail(cw, "port name %q: %s", port.Name, e)
				}
				if ports[port.Name] {
					c.fail(cw, "port name %q twice", port.Name)
				}
				ports[port.Name] = true
			}
			if numbers[port.ContainerPort] {
				c.fail(cw, "port %d twice", port.ContainerPort)
			}
			numbers[port.ContainerPort] = true
		}
		for kind, pr := range map[string]*corev1.Probe{"liveness": ct.LivenessProbe, "readiness": ct.ReadinessProbe, "startup": ct.StartupProbe} {
			if pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Port.StrVal != "" && !ports[pr.HTTPGet.Port.StrVal] {
				c.fail(cw, "%s probe names port %q, which the container does not declare", kind, pr.HTTPGet.Port.StrVal)
			}
		}
		defined := map[string]bool{}
		seen := map[string]bool{}
		for _, e := range ct.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				c.fail(cw, "env %q: %s", e.Name, msg)
			}
			if seen[e.Name] {
				c.fail(cw, "env %s set twice", e.Name)
			}
			seen[e.Name] = true
			for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
				if !defined[m[1]] {
					c.fail(cw, "env %s names $(%s), which is not defined before it (the kubelet would pass it as is)", e.Name, m[1])
				}
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && (e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "") {
				c.fail(cw, "env %s names no Secret or no key", e.Name)
			}
			defined[e.Name] = true
		}
		for _, m := range ct.VolumeMounts {
			if !volumes[m.Name] {
				c.fail(cw, "mounts volume %s, which the pod does not declare", m.Name)
			}
		}
		if c.binDir != "" {
			c.checkFlags(cw, ct)
		}
	}
}

// checkFlags holds every VITALS_* variable and --flag of a container against its binary's --help.
func (c *checker) checkFlags(where string, ct corev1.Container) {
	if len(ct.Command) == 0 {
		c.fail(where, "names no command (the image's entrypoint is the processor's; say which binary)")
		return
	}
	bin := filepath.Base(ct.Command[0])
	help, ok := c.helps[bin]
	if !ok {
		out, err := exec.Command(filepath.Join(c.binDir, bin), "--help").CombinedOutput()
		if err != nil {
			c.fail(where, "%s --help: %v (%s)", bin, err, strings.TrimSpace(string(out)))
			return
		}
		help = string(out)
		c.helps[bin] = help
	}
	for _, e := range ct.Env {
		// VITALS_LOG is every binary's log filter (vitals_runtime::shell), not a flag.
		if !strings.HasPrefix(e.Name, "VITALS_") || e.Name == "VITALS_LOG" {
			continue
		}
		if !strings.Contains(help, "[env: "+e.Name+"=") {
			c.fail(where, "passes %s, which %s --help does not list", e.Name, bin)
		}
	}
	for _, a := range append(append([]string{}, ct.Command[1:]...), ct.Args...) {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name := strings.SplitN(a, "=", 2)[0]
		if !regexp.MustCompile(`(^|[\s,])` + regexp.QuoteMeta(name) + `([\s=<,]|$)`).MatchString(help) {
			c.fail(where, "passes %s, which %s --help does not list", name, bin)
		}
	}
}

func (c *checker) checkService(s *corev1.Service) {
	if len(s.Spec.Selector) == 0 {
		c.fail("Service "+s.Name, "selects no pods")
	}
	if len(s.Spec.Ports) == 0 {
		c.fail("Service "+s.Name, "has no ports")
	}
}

func (c *checker) checkConfigMap(m *corev1.ConfigMap) {
	for key, text := range m.Data {
		for _, e := range validation.IsConfigMapKey(key) {
			c.fail("ConfigMap "+m.Name, "key %q: %s", key, e)
		}
		if strings.HasSuffix(key, ".toml") {
			var v map[string]any
			if _, err := toml.Decode(text, &v); err != nil {
				c.fail("ConfigMap "+m.Name, "%s is not TOML: %v", key, err)
			}
		}
	}
}

// podsSelectedBy returns the workloads whose pods a selector matches.
func (c *checker) podsSelectedBy(sel labels.Selector) []workload {
	var out []workload
	for _, w := range c.workloads {
		if sel.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

func (c *checker) crossCheck() {
	for _, s := range c.services {
		if len(s.Spec.Selector) == 0 {
			continue
		}
		ws := c.podsSelectedBy(labels.SelectorFromSet(s.Spec.Selector))
		if len(ws) == 0 {
			c.fail("Service "+s.Name, "selector %v matches no workload's pods", s.Spec.Selector)
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal == "" {
				continue
			}
			for _, w := range ws {
				if !declaresPort(w.template.Spec, p.TargetPort.StrVal) {
					c.fail("Service "+s.Name, "targets port %q, which %s's containers do not declare", p.TargetPort.StrVal, w.name)
				}
			}
		}
	}
	for _, p := range c.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || sel.Empty() || len(c.podsSelectedBy(sel)) == 0 {
			c.fail("PodDisruptionBudget "+p.Name, "selects no workload's pods (%v)", err)
		}
	}
	for _, s := range c.statefuls {
		if !c.hasService(s.Spec.ServiceName) {
			c.fail("StatefulSet "+s.Name, "names service %q, which is not rendered", s.Spec.ServiceName)
		}
	}
	for _, w := range c.workloads {
		for _, v := range w.template.Spec.Volumes {
			if v.ConfigMap != nil && c.configMaps[v.ConfigMap.Name] == nil {
				c.fail(w.name, "mounts ConfigMap %q, which is not rendered", v.ConfigMap.Name)
			}
		}
	}
	for _, m := range c.monitors {
		sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
		if err != nil || sel.Empty() {
			c.fail("ServiceMonitor "+m.Name, "needs a selector (%v)", err)
			continue
		}
		var matched []string
		for _, s := range c.services {
			if !sel.Matches(labels.Set(s.Labels)) {
				continue
			}
			matched = append(matched, s.Name)
			scraped := false
			for _, e := range m.Spec.Endpoints {
				for _, p := range s.Spec.Ports {
					if e.Port != "" && p.Name == e.Port {
						scraped = true
					}
				}
			}
			if !scraped {
				c.fail("ServiceMonitor "+m.Name, "selects Service %s but scrapes none of its ports", s.Name)
			}
			if m.Spec.JobLabel != "" && s.Labels[m.Spec.JobLabel] == "" {
				c.fail("ServiceMonitor "+m.Name, "job label %s is missing on Service %s", m.Spec.JobLabel, s.Name)
			}
		}
		sort.Strings(matched)
		if len(matched) == 0 {
			c.fail("ServiceMonitor "+m.Name, "selects no Service")
		}
	}
}

func (c *checker) hasService(name string) bool {
	for _, s := range c.services {
		if s.Name == name {
			return true
		}
	}
	return false
}

func declaresPort(p corev1.PodSpec, name string) bool {
	for _, ct := range p.Containers {
		for _, port := range ct.Ports {
			if port.Name == name {
				return true
			}
		}
	}
	return false
}
