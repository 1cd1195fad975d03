package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/voxpipe/voxpipe/internal/hub"
)

const k8sDir = "../../packaging/k8s"

// k8sDocs decodes every YAML document under packaging/k8s, by file.
func k8sDocs(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out := map[string][]map[string]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("%s: %v", filepath.Base(f), err)
				}
				break
			}
			if doc != nil {
				out[filepath.Base(f)] = append(out[filepath.Base(f)], doc)
			}
		}
	}
	return out
}

// at walks a decoded document: map keys, and list indexes as ints.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any, path ...any) string { s, _ := at(v, path...).(string); return s }

func list(v any, path ...any) []any { l, _ := at(v, path...).([]any); return l }

// serveFlags are the names of serve's flags, from its usage text.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	_, stderr, _ := runCmd(t, "serve", "--help")
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(stderr, -1) {
		names[m[1]] = true
	}
	if !names["listen"] || !names["drain-delay"] {
		t.Fatalf("serve's usage lists %v", names)
	}
	return names
}

// TestKubernetesManifests: the files under packaging/k8s parse, and what they say agrees
// with the program and with each other: every serve flag they pass exists, models are named
// as `voxpipe pull` names them, the probes ask the endpoints a server really answers without
// a key, the Service and the claim find the Deployment's port and volume, the Secret example
// has every key the Deployment reads, and the kustomization lists files that exist.
func TestKubernetesManifests(t *testing.T) {
	docs := k8sDocs(t)
	flags := serveFlags(t)
	one := func(file, kind string) map[string]any {
		t.Helper()
		for _, d := range docs[file] {
			if d["kind"] == kind {
				return d
			}
		}
		t.Fatalf("%s has no %s", file, kind)
		return nil
	}
	for file, ds := range docs {
		for _, d := range ds {
			if str(d, "apiVersion") == "" || str(d, "kind") == "" || d["kind"] != "Kustomization" && str(d, "metadata", "name") == "" {
				t.Errorf("%s: a document without apiVersion, kind or name: %v", file, d)
			}
		}
	}
	for _, r := range list(one("kustomization.yaml", "Kustomization"), "resources") {
		if _, err := os.Stat(filepath.Join(k8sDir, r.(string))); err != nil {
			t.Errorf("kustomization: %v", err)
		}
	}

	dep := one("deployment.yaml", "Deployment")
	pod := at(dep, "spec", "template")
	labels := at(pod, "metadata", "labels").(map[string]any)
	secret := at(one("secret.example.yaml", "Secret"), "stringData").(map[string]any)
	var listenPort string
	for _, file := range []string{"deployment.yaml", "hostnetwork-patch.yaml"} {
		c := at(one(file, "Deployment"), "spec", "template", "spec", "containers", 0)
		env := map[string]bool{}
		for _, e := range append(list(c, "env"), list(at(pod, "spec", "containers", 0), "env")...) {
			env[str(e, "name")] = true
			if ref := str(e, "valueFrom", "secretKeyRef", "key"); ref != "" && secret[ref] == nil {
				t.Errorf("%s: the Secret example lacks %s", file, ref)
			}
		}
		args := list(c, "args")
		if len(args) == 0 || args[0] != "serve" {
			t.Fatalf("%s: args %v", file, args)
		}
		for _, a := range args[1:] {
			name, val, _ := strings.Cut(strings.TrimPrefix(a.(string), "--"), "=")
			if !strings.HasPrefix(a.(string), "--") || !flags[name] {
				t.Errorf("%s: %q is not a serve flag", file, a)
			}
			for _, m := range regexp.MustCompile(`\$\((\w+)\)`).FindAllStringSubmatch(val, -1) {
				if !env[m[1]] {
					t.Errorf("%s: %s refers to $(%s), which the container does not define", file, a, m[1])
				}
			}
			switch name {
			case "vc-model", "tts-model", "codec":
				if _, ok := hub.Lookup(val); !ok {
					t.Errorf("%s: --%s=%s is not a model voxpipe pull knows", file, name, val)
				}
			case "listen":
				_, listenPort, _ = net.SplitHostPort(val)
			}
		}
	}
	c := at(pod, "spec", "containers", 0)
	if str(c, "ports", 0, "name") != "http" || at(c, "ports", 0, "containerPort") != mustAtoi(t, listenPort) {
		t.Errorf("container port %v, --listen port %s", at(c, "ports"), listenPort)
	}
	probes := map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
	for probe, path := range probes {
		if str(c, probe, "httpGet", "path") != path || str(c, probe, "httpGet", "port") != "http" {
			t.Errorf("%s: %v, want GET %s on port http", probe, at(c, probe), path)
		}
	}
	if v := at(c, "resources", "requests", "cpu"); v != "2" {
		t.Errorf("cpu request %v, want 2 cores", v)
	}
	var claims []string
	for _, v := range list(pod, "spec", "volumes") {
		if n := str(v, "persistentVolumeClaim", "claimName"); n != "" {
			claims = append(claims, n)
		}
	}
	pvc := one("pvc.yaml", "PersistentVolumeClaim")
	if !slices.Equal(claims, []string{str(pvc, "metadata", "name")}) || str(pvc, "spec", "accessModes", 0) != "ReadWriteMany" {
		t.Errorf("claims %v, PVC %v", claims, pvc)
	}
	svc := one("service.yaml", "Service")
	for k, v := range at(svc, "spec", "selector").(map[string]any) {
		if labels[k] != v {
			t.Errorf("the Service selects %s=%v; the pods are labelled %v", k, v, labels)
		}
	}
	if str(svc, "spec", "ports", 0, "targetPort") != "http" {
		t.Errorf("Service targetPort %v", at(svc, "spec", "ports"))
	}
	job := at(one("pull-models-job.yaml", "Job"), "spec", "template", "spec", "containers", 0)
	script := str(job, "args", 0)
	_, pulled, _ := strings.Cut(script, "voxpipe pull --dir /shared/models ")
	for _, n := range strings.Fields(pulled) {
		if _, ok := hub.Lookup(n); !ok {
			t.Errorf("the Job pulls %q, which voxpipe pull does not know", n)
		}
	}
	if pulled == "" || !strings.Contains(script, "/shared/voices") {
		t.Errorf("the Job's script %q", script)
	}

	// The probes' paths answer 200 without a key on a server with keys.
	base := testApp(t, serveOptions{apiKeys: []string{"probe-client-key-0123456789"}})
	for _, path := range probes {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s without a key: %d", path, resp.StatusCode)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("port %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}
