package memtool

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agemem/agemem/model/chat"
)

// The meta-tools, named as the paper's prompt names them.
const (
	SearchTools = "SYS_SEARCH_TOOLS"
	RemoveTools = "SYS_REMOVE_TOOLS"
)

// searchSpec and removeSpec are the meta-tools as every agent sees them,
// in a Conversation and through the Gateway: one declaration, so that a
// policy trained on one reads the same text from the other.
func searchSpec() chat.Function {
	return chat.Function{Name: SearchTools,
		Description: "Search the tool database and add the tools found to your context: one search keyword for each tool you want to add.",
		Parameters:  listSchema("keywords", "Search keywords, one for each tool to add.")}
}

func removeSpec() chat.Function {
	return chat.Function{Name: RemoveTools,
		Description: "Remove tools you no longer need from your context, by their exact names.",
		Parameters:  listSchema("tool_names", "Names of the tools to remove, verbatim.")}
}

func listSchema(arg, desc string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"type": "object", "required": []string{arg}, "properties": map[string]any{
		arg: map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": desc}}})
	return b
}

// limitHit is the paper's error for an Autonomous search past L.
const limitHit = "Hit L limit, remove tools."

// addedText and removedText are the meta-tools' results ("with helpful
// result messages such as N tools added: tool names", Section 3.1).
func addedText(added []string) string {
	return fmt.Sprintf("%d tools added: %s", len(added), strings.Join(added, ", "))
}

func removedText(gone, asked []string) string {
	out := fmt.Sprintf("%d tools removed: %s", len(gone), strings.Join(gone, ", "))
	var not []string
	for _, n := range asked {
		if !slices.Contains(gone, n) {
			not = append(not, n)
		}
	}
	if len(not) > 0 {
		out += fmt.Sprintf(". Not removed (not loaded, or a meta-tool): %s", strings.Join(not, ", "))
	}
	return out
}

var dateRe = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)

// autonomousPrompt is Figure 5, verbatim but for the assistant and
// background lines (config keys) and the limit (L).
const autonomousPrompt = `You are a highly intelligent {assistant} to answer the user question.
To access these tools, you need to use the 'SYS_SEARCH_TOOLS' tool to search for the tools that match the user question.
These tools will get added to your memory context and you can decide which ones to use.
However, since these tools stay in your memory throughout the conversation, you need to be careful on not loading too many tools into your context.
You cannot have more than {limit} tools in your active memory context.
IMPORTANT: Remove tools using 'SYS_REMOVE_TOOLS' when you do not use them for more than 2 subsequent user turns.

The current date is {current_date} , use this date as context for the user questions.

<Background about your tools in a database>
{background}
</Background about your tools in a database>

<When to search for new tools>
You should search for new tools when:
1. You do not have any tools loaded in your context.
2. You have tools loaded, but they are not relevant to the user question.
</When to search for new tools>

<When to remove tools>
You should remove tools when:
1. As soon as the user asks a question, and the tools you have loaded are not relevant to the user question, remove them immediately, so they don't build up!!!
2. Since {limit} tools is the maximum, you should be super careful to have a high tool count loaded!
</When to remove tools>

<Key Requirements>
1. Understand the user question and which tools are needed to answer it, and start to think about the keywords to search for them.
2. IMPORTANT: Remove inactive tools
  * As soon as the user asks a question, and the tools you have loaded are not relevant to the user question, remove them immediately with SYS_REMOVE_TOOLS.
  * Once the irrelevant tools are removed, if you need more tools to answer the question, you can search for them.
  * If new tools are needed, call 'SYS_SEARCH_TOOLS' to attach new tools to your context.
  The 'SYS_SEARCH_TOOLS' takes a list of search keywords for each tool you want to search for and add.
  If you want to add multiple tools at once, like search for multiple companies financial metric tools, then make a list of search queries for each one within the tool.
3. Once new tools are added, figure out which one you need.
NOTE: if still you believe there isn't the right tool to answer the question, you can call 'SYS_SEARCH_TOOLS' again to add more, or simply tell the user you cannot
answer the question with the available tools.
3. Answer the question
  * Call the appropriate task-specific tools you have loaded.
  * Compose a concise, clear answer for the user.
4. Never remove the 'SYS_SEARCH_TOOLS' and 'SYS_REMOVE_TOOLS' tools from your context, as they are essential for managing your memory and tool usage.
</Key Requirements>

<YOUR CURRENT TOOL COUNT>
Tool count: {num_tools}
Take the necessary actions to answer the user question as well as manage your tool memory effectively
</YOUR CURRENT TOOL COUNT>`

// compactPrompt is the Autonomous agent's system message of memtool.prompt
// compact: Figure 5's rules (search, call, answer; remove what a new
// question does not need; at most L tools) and its tool count.
const compactPrompt = `You are a {assistant}. Search the tool database with SYS_SEARCH_TOOLS for the tools a question needs, call them and answer with their results. Loaded tools stay in your context, at most {limit} of them: when a new question comes, first remove with SYS_REMOVE_TOOLS the tools it does not need.
The current date is {current_date}. Tool count: {num_tools}`

// searchPrompt is Figure 6 (Workflow's LLM_search).
const searchPrompt = `You are a highly intelligent {assistant} to answer the user question.
Your task is to create search keywords to find the tools to use for the user question.

<Background about your tools in a database>
{background}
- Each tool is a combination of a company and financial metric. So your keyword should reflect both the company and financial metric to search for.
</Background about your tools in a database>

If you need more tools, search for them, with a list of search keywords based on the user question.
When the user question comes in, decide if you need new tools, and if so, create a list of search keywords to find the tools to use for the user question.`

// prunePrompt is Figure 7 (LLM_prune of Workflow and Hybrid).
const prunePrompt = `You are a highly intelligent {assistant} to answer the user question.
Your task is to look at the existing tools and decide if you need to remove any of them based on the user question.
If the existing tools are not directly relevant to answering the user question, you should remove them.

<Background about your tools in a database>
{background}
</Background about your tools in a database>

When the user question comes in, decide if any of the existing tools are not relevant to answering the user question.
If any of the existing tools are not relevant, then create a list of tools to remove. Their names need to match verbatim, otherwise the removal will not work.`

// agentPrompt is the agent's system message in Workflow and Hybrid mode,
// which the paper does not print: Figure 5's framing without the removal
// instructions (and, in Workflow, without search).
const agentPrompt = `You are a highly intelligent {assistant} to answer the user question.
The current date is {current_date} , use this date as context for the user questions.
{search}Call the appropriate task-specific tools you have loaded, then compose a concise, clear answer for the user.

<YOUR CURRENT TOOL COUNT>
Tool count: {num_tools}
</YOUR CURRENT TOOL COUNT>`

const hybridSearchLine = "If the tools you have loaded are not relevant to the user question, call 'SYS_SEARCH_TOOLS' with a list of search keywords, one for each tool you need.\n"

// humanMessage is the user message of Figures 6 and 7.
func humanMessage(existing []string, query string) string {
	return "Existing tools: ```\n" + strings.Join(existing, "\n") + "\n```\nUser Query: `" + query + "` "
}

// summaryPrompt asks the controller to summarise the dialogue that
// history truncation would drop (SUMMARIZEHISTORY; the paper gives no
// prompt).
const summaryPrompt = `Summarise the conversation below for an assistant that will continue it: the user's questions, the answers given and any figures they contain. Leave out which tools were loaded or removed. Write at most 200 words.`

// AutonomousPrompt is the Autonomous agent's system message with n tools
// in its context (the meta-tools included): Figure 5, or its compact form
// (memtool.prompt), {current_date} memtool.date or now's. A Conversation
// renders it every turn; an MCP host in front of the Gateway sends it, so
// that a policy trained in a Conversation reads what it was trained on
// (GatewaySession).
func AutonomousPrompt(c Config, n int, now func() time.Time) string {
	return render(autonomousTemplate(c), promptVars(c, n, now))
}

func autonomousTemplate(c Config) string {
	if c.Prompt == "compact" {
		return compactPrompt
	}
	return autonomousPrompt
}

func promptVars(c Config, n int, now func() time.Time) map[string]string {
	date := c.Date
	if date == "" {
		date = now().Format("2006-01-02")
	}
	return map[string]string{"assistant": c.Assistant, "background": c.Background,
		"limit": strconv.Itoa(c.Limit), "current_date": date, "num_tools": strconv.Itoa(n)}
}

func render(tmpl string, vars map[string]string) string {
	pairs := make([]string, 0, 2*len(vars))
	for k, v := range vars {
		pairs = append(pairs, "{"+k+"}", v)
	}
	return strings.NewReplacer(pairs...).Replace(tmpl)
}
