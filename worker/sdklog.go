package worker

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	protologger "github.com/livekit/protocol/logger"
	lksdk "github.com/livekit/server-sdk-go/v2"
)

// quietSDK sends the LiveKit SDK's logs (and Pion's, through it) to log, warnings and
// errors only: at info it narrates every signaling state change.
func quietSDK(log *slog.Logger) {
	h := minLevel{log.Handler().WithAttrs([]slog.Attr{slog.String("component", "livekit-sdk")}), slog.LevelWarn}
	lksdk.SetLogger(protologger.LogRLogger(logr.FromSlogHandler(h)))
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}
func (h minLevel) WithGroup(n string) slog.Handler { return minLevel{h.Handler.WithGroup(n), h.min} }
