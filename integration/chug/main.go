// chug-json reads log lines on stdin with lager's chug, as Garden reads an image
// plugin's stderr, and prints one JSON object per line: whether chug took it for a
// lager line, and what it read from it.
package main

import (
	"encoding/json"
	"os"

	"code.cloudfoundry.org/lager/v3/chug"
)

type read struct {
	IsLager  bool                   `json:"is_lager"`
	Raw      string                 `json:"raw"`
	LogLevel int                    `json:"log_level"`
	Source   string                 `json:"source"`
	Message  string                 `json:"message"`
	Session  string                 `json:"session"`
	Error    string                 `json:"error"`
	Unix     int64                  `json:"unix"`
	Data     map[string]interface{} `json:"data"`
}

func main() {
	entries := make(chan chug.Entry)
	go chug.Chug(os.Stdin, entries)
	out := json.NewEncoder(os.Stdout)
	for entry := range entries {
		r := read{IsLager: entry.IsLager, Raw: string(entry.Raw)}
		if entry.IsLager {
			r.LogLevel = int(entry.Log.LogLevel)
			r.Source = entry.Log.Source
			r.Message = entry.Log.Message
			r.Session = entry.Log.Session
			r.Unix = entry.Log.Timestamp.Unix()
			r.Data = entry.Log.Data
			if entry.Log.Error != nil {
				r.Error = entry.Log.Error.Error()
			}
		}
		if err := out.Encode(r); err != nil {
			os.Exit(1)
		}
	}
}
