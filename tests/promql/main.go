// promql-check parses PromQL expressions, one per line on stdin, with Prometheus' own parser and
// prints one line per expression: "ok <value type>" or "error <message>". It exits 1 if any
// expression failed. tests/unit/chart/test_dashboard.py runs it over the chart's Grafana dashboard, so
// that a query Prometheus would refuse fails a test instead of showing an empty panel.
package main

import (
	"bufio"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	p := parser.NewParser(parser.Options{})
	failed := false
	for in.Scan() {
		expr, err := p.ParseExpr(in.Text())
		if err != nil {
			failed = true
			fmt.Printf("error %v\n", err)
			continue
		}
		fmt.Printf("ok %s\n", expr.Type())
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
