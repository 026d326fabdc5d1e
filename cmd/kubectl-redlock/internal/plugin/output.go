package plugin

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

// Output formats the plugin prints itself; the others are cli-runtime's.
const (
	formatTable = ""
	formatWide  = "wide"
	formatName  = "name"
)

// output is the -o flag of a read command, as kubectl's: a table (with
// -o wide, more columns) or a description, -o name for a command that
// lists objects, and kubectl's own printers (cli-runtime) for json, yaml,
// jsonpath and go-template, with --template and
// --allow-missing-template-keys.
type output struct {
	format string
	// what the command prints without -o: "a table" or "a description".
	what string
	// wide and name: the command offers -o wide and -o name.
	wide, name bool
	jsonYaml   *genericclioptions.JSONYamlPrintFlags
	template   *genericclioptions.KubeTemplatePrintFlags
}

// plain is the output of a command that prints what (a table or a
// description) and lists no objects: no wide, no name.
func plain(what string) *output { return &output{what: what} }

// listing is the output of a command that lists objects in a table.
func listing() *output { return &output{what: "a table", wide: true, name: true} }

// add adds the flags to cmd, and checks -o before the command runs.
func (o *output) add(cmd *cobra.Command) {
	o.jsonYaml = genericclioptions.NewJSONYamlPrintFlags()
	o.template = genericclioptions.NewKubeTemplatePrintFlags()
	o.template.AddFlags(cmd)
	cmd.Flags().StringVarP(&o.format, "output", "o", "", fmt.Sprintf("Output format (default: %s). One of: %s. The shapes are documented in docs/tasks/kubectl-plugin.md.", o.what, strings.Join(o.formats(), "|")))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return o.formats(), cobra.ShellCompDirectiveNoFileComp
	})
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if o.own(o.effective()) {
			return nil
		}
		_, err := o.printer()
		return err
	}
}

// formats are the -o values the command takes.
func (o *output) formats() []string {
	var out []string
	if o.wide {
		out = append(out, formatWide)
	}
	if o.name {
		out = append(out, formatName)
	}
	out = append(out, o.jsonYaml.AllowedFormats()...)
	return append(out, o.template.AllowedFormats()...)
}

// own reports whether the plugin prints format itself: the default, and
// wide and name where the command offers them; cli-runtime prints the rest.
func (o *output) own(format string) bool {
	return format == formatTable || format == formatWide && o.wide || format == formatName && o.name
}

// effective is the format asked for: as kubectl does, --template without
// -o means -o go-template.
func (o *output) effective() string {
	if o.format == formatTable && o.template.TemplateArgument != nil && *o.template.TemplateArgument != "" {
		return "go-template"
	}
	return o.format
}

// printer is cli-runtime's printer for the format asked for, or kubectl's
// error naming the formats the command takes.
func (o *output) printer() (printers.ResourcePrinter, error) {
	format := o.effective()
	p, err := o.jsonYaml.ToPrinter(format)
	if !genericclioptions.IsNoCompatiblePrinterError(err) {
		return p, err
	}
	p, err = o.template.ToPrinter(format)
	if !genericclioptions.IsNoCompatiblePrinterError(err) {
		return p, err
	}
	return nil, genericclioptions.NoCompatiblePrinterError{OutputFormat: &format, AllowedFormats: o.formats()}
}

// print writes doc as asked: with table (which gets whether -o wide was
// asked for) for the default and wide, one TYPE/NAME a line for -o name,
// else with kubectl's printer.
func (o *output) print(w io.Writer, doc report.Document, table func(wide bool) error) error {
	format := o.effective()
	if !o.own(format) {
		p, err := o.printer()
		if err != nil {
			return err
		}
		if err := p.PrintObj(doc, w); err != nil {
			return fmt.Errorf("print the output as %s: %w", format, err)
		}
		return nil
	}
	if format != formatName {
		return table(format == formatWide)
	}
	named, ok := doc.(report.Named)
	if !ok {
		return errors.New("-o name: this command lists no objects")
	}
	for _, n := range named.Names() {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return fmt.Errorf("write the output: %w", err)
		}
	}
	return nil
}
