// keda-scaler-probe: KEDA's own Kafka scaler (github.com/kedacore/keda/v2/pkg/scalers), driven
// from stdin so kworkers' tests read what KEDA would read, not a re-implementation of it.
//
// Protocol, one JSON document a line:
//
//	in:  {"triggers": [{"name": "kafka-0", "metadata": {<the Kafka trigger's metadata>}}]}
//	out: {"triggers": [{"name": "kafka-0", "metric": "s0-kafka-orders", "target": 100}]}
//	in:  poll
//	out: {"triggers": [{"name": "kafka-0", "value": 1234, "active": true}]}   (or "error")
//	in:  quit (or end of input): every scaler closed, exit 0
//
// One scaler instance per trigger, made once and kept across polls as KEDA's operator keeps it
// (excludePersistentLag compares each poll's committed offsets with the previous poll's).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
	v2 "k8s.io/api/autoscaling/v2"
)

type triggerIn struct {
	Name       string            `json:"name"`
	Metadata   map[string]string `json:"metadata"`
	AuthParams map[string]string `json:"authParams,omitempty"`
}

type configIn struct {
	Triggers []triggerIn `json:"triggers"`
}

type triggerOut struct {
	Name   string   `json:"name"`
	Metric string   `json:"metric,omitempty"`
	Target *float64 `json:"target,omitempty"`
	Value  *float64 `json:"value,omitempty"`
	Active *bool    `json:"active,omitempty"`
	Error  string   `json:"error,omitempty"`
}

type reply struct {
	Triggers []triggerOut `json:"triggers,omitempty"`
	Error    string       `json:"error,omitempty"`
}

type live struct {
	name   string
	metric string
	scaler scalers.Scaler
}

func emit(out *json.Encoder, r reply) {
	if err := out.Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "keda-scaler-probe: cannot write:", err)
		os.Exit(1)
	}
}

func main() {
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	if !in.Scan() {
		return
	}
	var cfg configIn
	if err := json.Unmarshal(in.Bytes(), &cfg); err != nil {
		emit(out, reply{Error: "the first line is not the triggers' JSON: " + err.Error()})
		os.Exit(2)
	}
	var scalersLive []live
	defer func() {
		for _, l := range scalersLive {
			_ = l.scaler.Close(ctx)
		}
	}()
	made := reply{}
	for i, t := range cfg.Triggers {
		auth := t.AuthParams
		if auth == nil {
			auth = map[string]string{}
		}
		config := &scalersconfig.ScalerConfig{
			ScalableObjectName:      "kworkers-probe",
			ScalableObjectNamespace: "default",
			ScalableObjectType:      "ScaledObject",
			GlobalHTTPTimeout:       10 * time.Second,
			TriggerName:             t.Name,
			TriggerType:             "kafka",
			TriggerMetadata:         t.Metadata,
			ResolvedEnv:             map[string]string{},
			AuthParams:              auth,
			TriggerIndex:            i,
			MetricType:              v2.AverageValueMetricType,
		}
		s, err := scalers.NewKafkaScaler(ctx, config)
		if err != nil {
			emit(out, reply{Error: fmt.Sprintf("trigger %s: %v", t.Name, err)})
			os.Exit(2)
		}
		spec := s.GetMetricSpecForScaling(ctx)
		if len(spec) != 1 || spec[0].External == nil {
			emit(out, reply{Error: fmt.Sprintf("trigger %s: not one external metric", t.Name)})
			os.Exit(2)
		}
		metric := spec[0].External.Metric.Name
		o := triggerOut{Name: t.Name, Metric: metric}
		if avg := spec[0].External.Target.AverageValue; avg != nil {
			f := avg.AsApproximateFloat64()
			o.Target = &f
		}
		made.Triggers = append(made.Triggers, o)
		scalersLive = append(scalersLive, live{name: t.Name, metric: metric, scaler: s})
	}
	emit(out, made)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "poll":
			r := reply{}
			for _, l := range scalersLive {
				o := triggerOut{Name: l.name}
				values, active, err := l.scaler.GetMetricsAndActivity(ctx, l.metric)
				if err != nil {
					o.Error = err.Error()
				} else {
					total := 0.0
					for _, v := range values {
						total += v.Value.AsApproximateFloat64()
					}
					o.Value = &total
					o.Active = &active
				}
				r.Triggers = append(r.Triggers, o)
			}
			emit(out, r)
		case "quit":
			return
		case "":
		default:
			emit(out, reply{Error: "unknown command: " + in.Text()})
		}
	}
}
