package acl

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
	"github.com/hashicorp/hcl/hcl/token"
)

// Rule is one parsed rule of a policy: `key_prefix "app/" { policy =
// "write" }` is {ResourceKey, "app/", true, AccessWrite}; `operator =
// "read"` is {ResourceOperator, "", false, AccessRead}.
type Rule struct {
	Resource Resource
	Name     string
	Prefix   bool
	Access   Access
}

// RulesError is a policy's rules that do not parse or name something the
// language does not have. Its text says what was found and what is allowed.
type RulesError struct{ Detail string }

func (e *RulesError) Error() string { return "invalid ACL rules: " + e.Detail }

// blockResources are the rule names that take a name and a block; the
// value is the resource and whether it is the prefix form.
var blockResources = map[string]struct {
	r      Resource
	prefix bool
}{
	"key": {ResourceKey, false}, "key_prefix": {ResourceKey, true},
	"service": {ResourceService, false}, "service_prefix": {ResourceService, true},
	"node": {ResourceNode, false}, "node_prefix": {ResourceNode, true},
	"session": {ResourceSession, false}, "session_prefix": {ResourceSession, true},
	"agent": {ResourceAgent, false}, "agent_prefix": {ResourceAgent, true},
	"event": {ResourceEvent, false}, "event_prefix": {ResourceEvent, true},
}

const allowedRuleNames = "acl, agent, agent_prefix, event, event_prefix, key, key_prefix, node, node_prefix, " +
	"operator, service, service_prefix, session, session_prefix"

// ParseRules parses a policy's rules, written in Consul's rule language
// (HCL v1, or its JSON form). The rules come back in the order written.
// Any error is a *RulesError; ParseRules never panics, whatever the input
// (the store parses rules inside Apply).
func ParseRules(text string) (rules []Rule, err error) {
	defer func() {
		// NB: HCL v1 panics on a few malformed inputs (a string token it
		// cannot unquote); a panic here would stop every replica's apply.
		if p := recover(); p != nil {
			rules, err = nil, &RulesError{Detail: fmt.Sprintf("failed to parse: %v", p)}
		}
	}()
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	f, perr := hcl.Parse(text)
	if perr != nil {
		return nil, &RulesError{Detail: "failed to parse: " + perr.Error()}
	}
	list, ok := f.Node.(*ast.ObjectList)
	if !ok {
		return nil, &RulesError{Detail: "failed to parse: rules must be a list of rule blocks and assignments"}
	}
	p := &ruleParser{}
	for _, item := range list.Items {
		if err := p.item(item); err != nil {
			return nil, err
		}
	}
	return p.rules, nil
}

type ruleParser struct{ rules []Rule }

func keyText(k *ast.ObjectKey) string {
	if k.Token.Type == token.STRING {
		return k.Token.Value().(string)
	}
	return k.Token.Text
}

func (p *ruleParser) item(item *ast.ObjectItem) error {
	if len(item.Keys) == 0 {
		return &RulesError{Detail: "failed to parse: rule without a name"}
	}
	head := keyText(item.Keys[0])
	pos := item.Keys[0].Pos()
	switch head {
	case "acl", "operator":
		if len(item.Keys) != 1 {
			return &RulesError{Detail: fmt.Sprintf("%s at line %d takes no name: write %s = \"read\"", head, pos.Line, head)}
		}
		acc, err := literalPolicy(item.Val, head, "", false, pos)
		if err != nil {
			return err
		}
		p.rules = append(p.rules, Rule{Resource: Resource(head), Access: acc})
		return nil
	}
	br, ok := blockResources[head]
	if !ok {
		return &RulesError{Detail: fmt.Sprintf("unknown rule %q at line %d; allowed: %s", head, pos.Line, allowedRuleNames)}
	}
	if len(item.Keys) > 2 {
		return &RulesError{Detail: fmt.Sprintf("%s at line %d has %d names, want one", head, pos.Line, len(item.Keys)-1)}
	}
	if len(item.Keys) == 2 {
		return p.block(head, br.r, br.prefix, keyText(item.Keys[1]), item.Val, pos)
	}
	// The nested form: key_prefix { "app/" { policy = "write" } }, which
	// is also what the JSON form parses to.
	var bodies []ast.Node
	switch v := item.Val.(type) {
	case *ast.ObjectType:
		bodies = []ast.Node{v}
	case *ast.ListType:
		bodies = v.List
	default:
		return &RulesError{Detail: fmt.Sprintf("%s at line %d needs a name and a block: %s \"name\" { policy = \"read\" }", head, pos.Line, head)}
	}
	for _, b := range bodies {
		obj, ok := b.(*ast.ObjectType)
		if !ok {
			return &RulesError{Detail: fmt.Sprintf("%s at line %d needs a name and a block: %s \"name\" { policy = \"read\" }", head, pos.Line, head)}
		}
		for _, inner := range obj.List.Items {
			if len(inner.Keys) != 1 {
				return &RulesError{Detail: fmt.Sprintf("%s at line %d: want one name per block", head, pos.Line)}
			}
			if err := p.block(head, br.r, br.prefix, keyText(inner.Keys[0]), inner.Val, inner.Keys[0].Pos()); err != nil {
				return err
			}
		}
	}
	return nil
}

// block parses `{ policy = "..." }` for one named rule.
func (p *ruleParser) block(head string, r Resource, prefix bool, name string, val ast.Node, pos token.Pos) error {
	if strings.IndexByte(name, 0) >= 0 {
		return &RulesError{Detail: fmt.Sprintf("%s %q at line %d: names must not contain NUL", head, name, pos.Line)}
	}
	// NB: HCL v1 reads "${" in a quoted string as the start of an
	// interpolation, inside which quotes and escapes are kept verbatim:
	// such a name cannot be written back (FormatRules) as the same name.
	if strings.Contains(name, "${") {
		return &RulesError{Detail: fmt.Sprintf("%s %q at line %d: names must not contain \"${\" (HCL reads it as an interpolation)", head, name, pos.Line)}
	}
	var items []*ast.ObjectItem
	switch v := val.(type) {
	case *ast.ObjectType:
		items = v.List.Items
	case *ast.ListType:
		// JSON arrays of blocks: [{"policy": "read"}]
		for _, n := range v.List {
			o, ok := n.(*ast.ObjectType)
			if !ok {
				return &RulesError{Detail: fmt.Sprintf("%s %q at line %d needs a block: { policy = \"read\" }", head, name, pos.Line)}
			}
			items = append(items, o.List.Items...)
		}
	default:
		return &RulesError{Detail: fmt.Sprintf("%s %q at line %d needs a block: { policy = \"read\" }", head, name, pos.Line)}
	}
	var acc Access
	for _, it := range items {
		if len(it.Keys) != 1 {
			return &RulesError{Detail: fmt.Sprintf("%s %q at line %d: unexpected nested block", head, name, pos.Line)}
		}
		switch k := keyText(it.Keys[0]); {
		case k == "policy":
			if acc != AccessUnset {
				return &RulesError{Detail: fmt.Sprintf("%s %q at line %d sets policy twice", head, name, pos.Line)}
			}
			a, err := literalPolicy(it.Val, head, name, r == ResourceKey, it.Keys[0].Pos())
			if err != nil {
				return err
			}
			acc = a
		case k == "intentions" && r == ResourceService:
			// Consul's service intentions: accepted so Consul policies
			// load unchanged; Lodestone has no intentions to guard.
			if _, err := literalPolicy(it.Val, head, name, false, it.Keys[0].Pos()); err != nil {
				return err
			}
		default:
			return &RulesError{Detail: fmt.Sprintf("%s %q at line %d: unknown field %q; want policy", head, name, it.Keys[0].Pos().Line, k)}
		}
	}
	if acc == AccessUnset {
		return &RulesError{Detail: fmt.Sprintf("%s %q at line %d has no policy; want policy = \"read\", \"write\" or \"deny\"", head, name, pos.Line)}
	}
	p.rules = append(p.rules, Rule{Resource: r, Name: name, Prefix: prefix, Access: acc})
	return nil
}

// literalPolicy reads a quoted policy value. list is allowed only for keys.
func literalPolicy(val ast.Node, head, name string, allowList bool, pos token.Pos) (Access, error) {
	what := head
	if name != "" || head != "acl" && head != "operator" {
		what = fmt.Sprintf("%s %q", head, name)
	}
	want := `"read", "write" or "deny"`
	if allowList {
		want = `"read", "write", "list" or "deny"`
	}
	lit, ok := val.(*ast.LiteralType)
	if !ok || lit.Token.Type != token.STRING {
		return 0, &RulesError{Detail: fmt.Sprintf("%s at line %d: policy must be a string, one of %s", what, pos.Line, want)}
	}
	s, _ := lit.Token.Value().(string)
	switch s {
	case "read":
		return AccessRead, nil
	case "write":
		return AccessWrite, nil
	case "deny":
		return AccessDeny, nil
	case "list":
		if allowList {
			return AccessList, nil
		}
	}
	return 0, &RulesError{Detail: fmt.Sprintf("%s at line %d: invalid policy %q; want %s", what, pos.Line, s, want)}
}

// FormatRules writes rules back in the canonical HCL form, sorted, one
// rule per block; ParseRules(FormatRules(r)) holds the same rules.
func FormatRules(rules []Rule) string {
	rs := append([]Rule(nil), rules...)
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Resource != b.Resource {
			return a.Resource < b.Resource
		}
		if a.Prefix != b.Prefix {
			return !a.Prefix
		}
		return a.Name < b.Name
	})
	var sb strings.Builder
	for _, r := range rs {
		if r.Resource == ResourceACL || r.Resource == ResourceOperator {
			fmt.Fprintf(&sb, "%s = %q\n", r.Resource, r.Access.String())
			continue
		}
		head := string(r.Resource)
		if r.Prefix {
			head += "_prefix"
		}
		fmt.Fprintf(&sb, "%s %s {\n  policy = %q\n}\n", head, hclQuote(r.Name), r.Access.String())
	}
	return sb.String()
}

// hclQuote quotes s for HCL v1: only \ and " need escaping there, plus
// "${", which HCL reads as the start of an interpolation.
func hclQuote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '"':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		case '\n':
			sb.WriteString(`\n`)
		default:
			sb.WriteByte(c)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}
