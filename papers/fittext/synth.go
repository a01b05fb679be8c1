package fittext

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// A generated retrieval benchmark in ToolRet's layout, with the "semantic
// gap" the paper is about: tools are described in a database's words
// ("Returns the hourly precipitation forecast ..."), queries state a goal
// in a user's ("Should I take an umbrella ..."). Every provider offers
// most capabilities, so a query's provider names many tools and only the
// right capability of it is relevant; the other providers' same
// capability is a hard negative.

type intent struct {
	subset, key, tool string // subset, short name, the database description
	goals             []string
	vocab             string // the capability in the database's words (what a good pseudo-tool says)
}

var intents = []intent{
	{"web", "weather_forecast", "Returns the hourly precipitation forecast and temperature outlook for a location.", []string{"Should I take an umbrella when I go out in %s tomorrow?", "Will it be wet for the picnic in %s this weekend?"}, "hourly precipitation forecast temperature outlook location"},
	{"web", "air_quality", "Provides the air quality index and pollutant concentrations measured at a location.", []string{"Is it safe to go jogging outside in %s today, with all the smog?", "How dirty is the air around %s right now?"}, "air quality index pollutant concentrations"},
	{"web", "flight_status", "Looks up the departure and arrival status of a flight by its flight number.", []string{"Is my plane to %s going to leave on time?", "My sister flies in from %s; has she landed yet?"}, "departure arrival status flight number"},
	{"web", "currency_convert", "Converts an amount between two currencies using the latest exchange rates.", []string{"How many euros do I get for my dollars before my trip to %s?", "What is 200 pounds worth in yen for my stay in %s?"}, "converts amount currencies exchange rates"},
	{"web", "restaurant_search", "Searches restaurants near a location, filtered by cuisine, price range and rating.", []string{"Where can I eat good cheap sushi in %s tonight?", "Find me a nice place for dinner in %s."}, "searches restaurants cuisine price range rating"},
	{"web", "news_headlines", "Returns the top news headlines for a country or topic.", []string{"What is everyone talking about in %s today?", "Catch me up on what happened in %s this morning."}, "top news headlines country topic"},
	{"web", "stock_quote", "Returns the latest trading price and daily change of a stock ticker.", []string{"How are my shares doing today? I bought some in %s.", "Did the market go up for the company in %s?"}, "latest trading price daily change stock ticker"},
	{"web", "route_directions", "Computes driving or walking directions and travel time between two addresses.", []string{"How do I get to the museum in %s from my hotel?", "How long will it take me to drive across %s?"}, "driving walking directions travel time addresses"},
	{"code", "tensor_reshape", "Reshapes a tensor to a new shape without changing its data.", []string{"My array has the wrong dimensions for the %s model; how do I fix the layout?", "I need the batch as a flat matrix before the %s layer."}, "reshapes tensor new shape data"},
	{"code", "image_classify", "Classifies an image into one of a thousand object categories with a pretrained network.", []string{"What is in this photo I took in %s?", "Tell me whether my %s picture shows a cat or a dog."}, "classifies image object categories pretrained network"},
	{"code", "text_translate", "Translates text from a source language into a target language with a sequence model.", []string{"Put this letter into the language they speak in %s.", "I need my menu readable for guests from %s."}, "translates text source language target language"},
	{"code", "regex_match", "Finds every match of a regular expression pattern in a string.", []string{"Pull all the phone numbers out of this %s document.", "Which lines of my %s log contain an error code?"}, "match regular expression pattern string"},
	{"code", "solve_equation", "Solves a system of linear equations given its coefficient matrix.", []string{"Two unknowns, two conditions from my %s homework: what are x and y?", "Find the values that satisfy all three of these %s constraints."}, "solves system linear equations coefficient matrix"},
	{"code", "sort_records", "Sorts a list of records by one or more keys in ascending or descending order.", []string{"Put the %s customers in order of how much they spent.", "Rank the %s results from newest to oldest."}, "sorts list records keys ascending descending"},
	{"code", "summarize_text", "Produces an abstractive summary of a long document.", []string{"Give me the gist of this long %s report.", "I have no time to read the %s article; what does it say?"}, "abstractive summary long document"},
	{"code", "speech_to_text", "Transcribes spoken audio into written text.", []string{"Write down what was said in the voice memo from %s.", "I need the minutes of the %s call as text."}, "transcribes spoken audio written text"},
	{"customized", "calendar_create", "Creates a calendar event with a title, start time, end time and attendees.", []string{"Put the team lunch in %s on my schedule for Friday noon.", "Book an hour with Dana about the %s launch next week."}, "creates calendar event title start time attendees"},
	{"customized", "email_send", "Sends an email message with a subject and body to one or more recipients.", []string{"Let the %s office know that I will be late.", "Drop a note to the %s team thanking them."}, "sends email message subject body recipients"},
	{"customized", "reminder_set", "Schedules a reminder notification at a given date and time.", []string{"Don't let me forget to call the %s supplier on Monday.", "Nudge me before the %s deadline."}, "schedules reminder notification date time"},
	{"customized", "contact_lookup", "Retrieves a contact's phone number and email address from the address book.", []string{"How do I reach the person I met in %s?", "What's the number of my colleague in %s?"}, "retrieves contact phone number email address book"},
	{"customized", "expense_report", "Records an expense with an amount, category and receipt in the expense tracker.", []string{"I paid for the taxi in %s myself; log it so I get the money back.", "Keep track of the hotel bill from %s for reimbursement."}, "records expense amount category receipt tracker"},
	{"customized", "file_share", "Shares a document with other users and sets their access permissions.", []string{"Let the %s partners see the draft but not edit it.", "Give the %s auditors access to the spreadsheet."}, "shares document users access permissions"},
	{"customized", "music_play", "Starts playback of a song, album or playlist on a device.", []string{"Put on something relaxing, like the songs from my trip to %s.", "I want to hear that band from %s now."}, "starts playback song album playlist device"},
	{"customized", "smart_light", "Sets the brightness and color of smart light bulbs in a room.", []string{"Make the living room cosy like the cafe in %s.", "It's too dark to read here; do something, like it was in %s."}, "sets brightness color smart light bulbs room"},
}

var places = []string{"Lisbon", "Osaka", "Nairobi", "Quito", "Oslo", "Hanoi", "Perth", "Tunis", "Lima", "Riga", "Accra", "Busan"}

var providerParts = [][]string{{"Zen", "Blue", "Nova", "Apex", "Orbit", "Pixel", "Quant", "Terra", "Vivid", "Lumen"}, {"ly", "hub", "io", "wise", "kit", "base", "forge", "stack"}}

// Synth writes a benchmark of providers × the capabilities and n queries
// in ToolRet's layout: the corpus (JSONL: id, documentation) and the
// queries (JSONL: id, query, subset, labels as ToolRet stores them, a
// JSON string). The same seed gives the same files.
func Synth(seed uint64, providers, n int) (corpus, queries []byte, err error) {
	if providers < 1 || providers > len(providerParts[0])*len(providerParts[1]) || n < 1 {
		return nil, nil, fmt.Errorf("fittext: synth needs 1-%d providers and at least one query", len(providerParts[0])*len(providerParts[1]))
	}
	r := rand.New(rand.NewPCG(seed, 0x66697474))
	perm := r.Perm(len(providerParts[0]) * len(providerParts[1]))
	var provs []string
	for _, p := range perm[:providers] {
		provs = append(provs, providerParts[0][p/len(providerParts[1])]+providerParts[1][p%len(providerParts[1])])
	}
	var cb, qb strings.Builder
	offers := map[[2]int]bool{}
	for pi, p := range provs {
		for ii, in := range intents {
			if r.IntN(10) == 0 { // a provider lacks a tenth of the capabilities
				continue
			}
			offers[[2]int{pi, ii}] = true
			doc, _ := json.Marshal(map[string]any{"name": p + " " + strings.ReplaceAll(in.key, "_", " "), "description": p + ": " + in.tool})
			line, _ := json.Marshal(map[string]string{"id": p + "/" + in.key, "documentation": string(doc)})
			cb.Write(append(line, '\n'))
		}
	}
	for i := 0; i < n; {
		pi, ii := r.IntN(len(provs)), r.IntN(len(intents))
		if !offers[[2]int{pi, ii}] {
			continue
		}
		in := intents[ii]
		text := fmt.Sprintf(in.goals[r.IntN(len(in.goals))], places[r.IntN(len(places))]) + " Use " + provs[pi] + "."
		labels, _ := json.Marshal([]map[string]any{{"id": provs[pi] + "/" + in.key, "relevance": 1}})
		line, _ := json.Marshal(map[string]string{"id": fmt.Sprintf("%s-%d", in.subset, i), "query": text, "subset": in.subset, "labels": string(labels)})
		qb.Write(append(line, '\n'))
		i++
	}
	return []byte(cb.String()), []byte(qb.String()), nil
}
