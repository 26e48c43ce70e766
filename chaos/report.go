package chaos

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// reportColumns are the report's columns, in order.
var reportColumns = []string{"scenario", "calls", "ok", "over", "late", "failed", "allowed/budget", "overshoot", "refused early", "recover", "p99 survivors", "crashes", "verdict"}

// cells renders a row; total rows carry the budget and the verdict.
func (row Row) cells(total bool, res *Result) []string {
	st := row.Stats
	c := []string{row.Name, fmt.Sprint(st.Calls), fmt.Sprint(st.OK), fmt.Sprint(st.Over), fmt.Sprint(st.Late), fmt.Sprint(st.Failed)}
	if total {
		c = append(c, fmt.Sprintf("%d/%d", row.Allowed, row.Budget))
	} else {
		c = append(c, "")
	}
	c = append(c, fmt.Sprintf("%+d (%.1f%%)", row.Extra, row.Overshoot))
	if total {
		c = append(c, fmt.Sprint(row.Early))
	} else {
		c = append(c, "")
	}
	rec := ""
	if row.Recover > 0 {
		rec = row.Recover.Round(10 * time.Millisecond).String()
	}
	c = append(c, rec, ms(row.P99Survivors))
	if total {
		verdict := "pass"
		if len(res.Failures) > 0 {
			verdict = fmt.Sprintf("FAIL (%d)", len(res.Failures))
		}
		c = append(c, fmt.Sprint(row.Crashes), verdict)
	} else {
		c = append(c, "", "")
	}
	return c
}

func ms(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// FormatTable renders one row per scenario, each followed by its phases
// (indented), then every note and failed check. With markdown it is a
// Markdown table, else aligned plain text.
func FormatTable(results []*Result, markdown bool) string {
	var rows [][]string
	for _, res := range results {
		if res.Skipped != "" {
			r := make([]string, len(reportColumns))
			r[0], r[len(r)-1] = res.Name, "skipped"
			rows = append(rows, r)
			continue
		}
		total := res.Total
		if total.Name == "" {
			total.Name = res.Name
		}
		rows = append(rows, total.cells(true, res))
		for _, ph := range res.Phases {
			c := ph.cells(false, res)
			if markdown {
				c[0] = "&nbsp;&nbsp;↳ " + c[0]
			} else {
				c[0] = "  > " + c[0]
			}
			rows = append(rows, c)
		}
	}
	var b strings.Builder
	if markdown {
		b.WriteString("| " + strings.Join(reportColumns, " | ") + " |\n")
		b.WriteString("|" + strings.Repeat(" --- |", len(reportColumns)) + "\n")
		for _, r := range rows {
			b.WriteString("| " + strings.Join(r, " | ") + " |\n")
		}
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(reportColumns, "\t"))
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		tw.Flush()
	}
	b.WriteString("\n")
	for _, res := range results {
		if res.Skipped != "" {
			fmt.Fprintf(&b, "- %s: skipped: %s\n", res.Name, res.Skipped)
		}
		for _, ph := range res.Phases {
			if ph.RecoverWhat != "" {
				fmt.Fprintf(&b, "- %s / %s: recover = %s %v\n", res.Name, ph.Name, ph.RecoverWhat, ph.Recover.Round(time.Millisecond))
			}
		}
		for _, n := range res.Notes {
			fmt.Fprintf(&b, "- %s: %s\n", res.Name, n)
		}
		for _, f := range res.Failures {
			fmt.Fprintf(&b, "- %s: FAILED: %s\n", res.Name, f)
		}
	}
	return b.String()
}
