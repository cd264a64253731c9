package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Deployment and a Service that a cluster would take; each case below breaks one thing.
const good = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      securityContext: {runAsNonRoot: true}
      containers:
        - name: web
          image: example/web:1
          env:
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            - name: ID
              value: "web-$(POD_NAME)"
          ports:
            - {name: http, containerPort: 8080}
          readinessProbe:
            httpGet: {path: /readyz, port: http}
          securityContext: {readOnlyRootFilesystem: true}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
    - {name: http, port: 80, targetPort: http}
`

func problems(t *testing.T, stream string) []string {
	t.Helper()
	c, _, err := check(strings.NewReader(stream), "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return c.problems
}

func TestAValidStreamHasNoProblems(t *testing.T) {
	if p := problems(t, good); len(p) != 0 {
		t.Fatalf("problems in a valid stream: %v", p)
	}
}

func TestEachBreakageIsFound(t *testing.T) {
	cases := map[string]struct{ from, to, want string }{
		"an unknown field":             {"          image: example/web:1", "          image: example/web:1\n          imagePolicy: Always", "does not decode strictly"},
		"a field of the wrong type":    {"containerPort: 8080", "containerPort: http", "does not decode strictly"},
		"a duplicated field":           {"          image: example/web:1", "          image: example/web:1\n          image: example/web:2", "does not decode strictly"},
		"a variable named before it":   {"value: \"web-$(POD_NAME)\"", "value: \"web-$(HOST)\"", "not defined before it"},
		"a selector missing its pods":  {"    matchLabels: {app: web}", "    matchLabels: {app: api}", "does not match its pod template"},
		"a probe on an unknown port":   {"port: http}", "port: metrics}", "does not declare"},
		"a service selecting nothing":  {"  selector: {app: web}\n  ports", "  selector: {app: nothing}\n  ports", "matches no workload"},
		"a service on an unknown port": {"targetPort: http}", "targetPort: grpc}", "do not declare"},
		"a writable root":              {"readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "read-only root"},
		"root":                         {"runAsNonRoot: true", "runAsNonRoot: false", "non-root"},
		"an invalid name":              {"  name: web\n  labels", "  name: Web_1\n  labels", "name:"},
		"an unknown kind":              {"kind: Service", "kind: Ingress", "not expected"},
	}
	for name, tc := range cases {
		if !strings.Contains(good, tc.from) {
			t.Fatalf("%s: the valid stream has no %q", name, tc.from)
		}
		broken := strings.Replace(good, tc.from, tc.to, 1)
		p := problems(t, broken)
		if !strings.Contains(strings.Join(p, "\n"), tc.want) {
			t.Errorf("%s: want a problem saying %q, got %v", name, tc.want, p)
		}
	}
}

func TestAConfigMapsTomlMustParse(t *testing.T) {
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: targets}\ndata:\n  targets.toml: |\n    [defaults\n"
	if p := problems(t, cm); !strings.Contains(strings.Join(p, "\n"), "is not TOML") {
		t.Fatalf("a broken TOML file passed: %v", p)
	}
}

func TestFlagsAndVariablesMustBeInTheBinarysHelp(t *testing.T) {
	dir := t.TempDir()
	help := "#!/bin/sh\necho 'Usage: web [OPTIONS]'\necho '      --port <PORT>  the port [env: VITALS_PORT=]'\n"
	if err := os.WriteFile(filepath.Join(dir, "web"), []byte(help), 0o755); err != nil {
		t.Fatal(err)
	}
	withCommand := strings.Replace(good, "          image: example/web:1\n", "          image: example/web:1\n          command: [\"/usr/local/bin/web\", \"--port=8080\"]\n", 1)
	env := "            - name: ID\n"
	ok := strings.Replace(withCommand, env, "            - name: VITALS_PORT\n              value: \"8080\"\n"+env, 1)
	c, _, err := check(strings.NewReader(ok), dir, io.Discard)
	if err != nil || len(c.problems) != 0 {
		t.Fatalf("flags the help lists were refused: %v %v", err, c.problems)
	}
	for _, bad := range []string{
		strings.Replace(ok, "VITALS_PORT", "VITALS_PROT", 1),
		strings.Replace(ok, "--port=8080", "--prot=8080", 1),
		strings.Replace(ok, "/usr/local/bin/web", "/usr/local/bin/nothing", 1),
	} {
		c, _, err := check(strings.NewReader(bad), dir, io.Discard)
		if err != nil || len(c.problems) == 0 {
			t.Errorf("a flag or variable the help does not list passed (%v)", err)
		}
	}
}
