package rls

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// minJSONBody is the least bound of a /json request body; see
// Service.maxJSONBody.
const minJSONBody = 1 << 20

// maxJSONBody bounds a /json request body: 8 times the request bound
// (protojson is larger than the binary encoding the bound measures, which
// is checked again after decoding), at least minJSONBody.
func (s *Service) maxJSONBody() int64 {
	return max(minJSONBody, 8*int64(s.bounds.MaxRequestSize))
}

// HTTPHandler serves the reference's HTTP API: /healthcheck answers 200 "OK"
// when ready, else 500 (as the reference does) with "NOT READY: " and the
// reason in plain text, what notReady returns ("" when ready; nil means
// always ready). /json decides a protojson RateLimitRequest (camelCase or
// snake_case) sent with any method, answering 200 when OK, 429 when over
// the limit and 400 for a bad body.
func (s *Service) HTTPHandler(notReady func() string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if notReady != nil {
			if reason := notReady(); reason != "" {
				http.Error(w, "NOT READY: "+reason, http.StatusInternalServerError)
				return
			}
		}
		io.WriteString(w, "OK")
	})
	mux.HandleFunc("/json", s.serveJSON)
	return mux
}

// MaxJSONInFlight bounds the /json requests a Service reads and decodes at
// once. A body is decoded before the request bounds can be checked, and a
// body of small repeated messages decodes to a hundred times its size: the
// bound keeps that from multiplying by the number of callers. Beyond it,
// /json answers 503 with Retry-After.
const MaxJSONInFlight = 16

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	select {
	case s.jsonSlots <- struct{}{}:
		defer func() { <-s.jsonSlots }()
	default:
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("rls: more than %d /json requests in progress", MaxJSONInFlight), http.StatusServiceUnavailable)
		return
	}
	limit := s.maxJSONBody()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			http.Error(w, fmt.Sprintf("rls: request body is more than the bound of %d bytes", limit), http.StatusBadRequest)
			return
		}
		http.Error(w, "rls: reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "rls: bad request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "rls: encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}
