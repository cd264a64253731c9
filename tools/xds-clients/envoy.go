package main

import (
	"fmt"
	"os"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	// The extensions the configuration names in typed_config, so that its Any fields decode.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// checkEnvoyConfig decodes an Envoy bootstrap file strictly: every field must be one of Envoy's
// (protojson refuses unknown fields and unknown Any types), and the result must pass the protos'
// own validation rules (protoc-gen-validate's ValidateAll).
func checkEnvoyConfig(path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(text)
	if err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	var b bootstrap.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		return err
	}
	return b.ValidateAll()
}
